"""``autotune watch`` against live servers whose load drifts."""
