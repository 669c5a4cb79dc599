"""The reference application: the workflows a user of trioq writes (not part of the library)."""
