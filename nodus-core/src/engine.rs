//! The run engine: carries out the decider's decisions through the traits, journaling each.
