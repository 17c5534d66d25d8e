//! The decider: a pure function from a run's journal, inbox and clock to its next decision.
