//! The one loop that runs a sans-IO search's blocks on engines (culprit's and load's:
//! [`crate::core::machine`]): ask the search for its next block, hand the events it
//! reported on the way to a sink (the step log, the record rewritten), run the block,
//! give the search what it gave. Any error of the runner or the sink stops the search
//! where it stands; the caller closes the testbed and writes the record.

use crate::core::machine::{Machine, Next};

/// Runs one block a search asked for (a testbed; a log replayed before it).
#[allow(async_fn_in_trait)]
pub(crate) trait BlockRunner<Q, A> {
    async fn run_block(&mut self, block: &Q) -> anyhow::Result<A>;
}

/// Takes a search's events as they come.
pub(crate) trait EventSink<E> {
    fn event(&mut self, event: E) -> anyhow::Result<()>;
}

/// Drive `search` to its end: every event is in the sink before the next block runs,
/// so a record rewritten from them is current before every restart.
pub(crate) async fn drive<Q: Unpin, A, E, R>(
    mut search: Machine<Q, A, E, R>,
    runner: &mut impl BlockRunner<Q, A>,
    sink: &mut impl EventSink<E>,
) -> anyhow::Result<R> {
    loop {
        let next = search.next_block();
        for event in search.events() {
            sink.event(event)?;
        }
        match next {
            Next::Block(block) => {
                let outcome = runner.run_block(&block).await?;
                search.observe(outcome);
            }
            Next::Done(done) => return Ok(done),
        }
    }
}

/// A sink that keeps nothing (tests).
#[cfg(test)]
pub(crate) struct Discard;

#[cfg(test)]
impl<E> EventSink<E> for Discard {
    fn event(&mut self, _: E) -> anyhow::Result<()> {
        Ok(())
    }
}
