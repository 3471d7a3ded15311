//! Which commit of the engine introduced a load-dependent corruption (`bisect commits`,
//! docs/commits.md), as pure logic: a Bayesian search over "the first bad commit is c"
//! for every commit of a first-parent range plus "no single culprit", fed by blocks of
//! sessions whose oracle is noisy and three-valued (k corrupted of n judged, could not
//! tell, untestable).
//!
//! - [`posterior`]: the change-point model, its posterior, and the answers it can name
//!   (untestable commits widening one to a range);
//! - [`observation`]: what a block, or the flag's A/B pair of blocks, tells the search;
//! - [`params`]: what the search is asked, validated;
//! - [`action`]: what it asks for (rounds of blocks, each with its purpose) and answers;
//! - [`choose`]: the next commit, by expected information per second of cost;
//! - [`search`]: the state machine: the ends verified first, the search, the stopping
//!   rule and budget, the verification A/B of the answer against its parent;
//! - [`simulate`]: the search on scripted ranges beside plain and repeated bisection.

pub mod action;
pub mod choose;
pub mod observation;
pub mod params;
pub mod posterior;
pub mod search;
pub mod simulate;
#[cfg(test)]
mod tests;

pub use posterior::{Counts, Posterior};
pub use search::{Action, Answer, Observation, Params, Purpose, Search, Spent, Test};
