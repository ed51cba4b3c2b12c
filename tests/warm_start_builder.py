"""Builds the testbed's SFT warm start beside the test suite (started by tests/conftest.py).

It trains on one thread while the suite's other tests run on the second core; SIGUSR1, sent
when the suite reaches the first test that needs the warm start, switches it to the recipe's
own thread count for the rest. The weights are the same either way (`ppo.sft.train_sft`,
`threads`), and `ppo.sft.warm_start`'s lock and atomic save make a test that asks for the
warm start wait for this build instead of starting its own.

    python tests/warm_start_builder.py
"""

import signal

# The handler is installed before torch is imported (that takes seconds), since SIGUSR1's
# default action would end the build; until the training starts it only records the request.
_state = {"hurry": False, "training": None}


def _on_sigusr1(signum, frame):
    _state["hurry"] = True
    if _state["training"] is not None:
        import torch  # noqa: PLC0415 (imported by now)

        torch.set_num_threads(_state["training"])


signal.signal(signal.SIGUSR1, _on_sigusr1)


def main() -> None:
    from ppo.sft import SFTConfig, warm_start

    config = SFTConfig()
    _state["training"] = config.threads
    path = warm_start(config, progress=False, threads=config.threads if _state["hurry"] else 1)
    print(f"warm start built: {path}", flush=True)


if __name__ == "__main__":
    main()
