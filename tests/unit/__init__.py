"""Tests that neither train a model nor start a process nor take over ~2 s (`make test-fast`)."""
