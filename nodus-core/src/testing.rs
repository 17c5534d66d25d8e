//! Test doubles for code built on nodus-core: a manual clock and a recording sandbox.
