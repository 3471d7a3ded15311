//! The culprit search's pure logic: which flag values of a failing configuration are
//! needed for the failure ([`search`]), its class-mix test ([`mix`]) and the scripted
//! oracles it is scored on ([`simulate`]). No I/O: engines sit behind
//! [`search::StepRunner`]; `commands::culprit` runs it on a testbed.

pub mod mix;
pub mod search;
pub mod simulate;
