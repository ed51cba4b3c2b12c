"""Checks on a configuration: settings that do nothing in it (refused or warned), the liveness proof of every field, did-you-mean suggestions."""
