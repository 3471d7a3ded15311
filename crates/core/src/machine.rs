//! Sans-IO searches written as straight-line code. A search whose order is easiest to
//! read as nested steps (culprit's ddmin, load's adaptive pairs) is written as an
//! `async fn` whose only await is [`Port::ask`]; [`Machine`] turns it into the
//! `next_block`/`observe` state machine every search of this crate offers (the
//! compiler builds the states from the `async fn`, as it does for any future). Nothing
//! here runs an executor or does I/O: the search is polled with a waker that does
//! nothing, because nothing but [`Machine::observe`] ever makes it ready again. The one
//! loop outside that runs blocks lives in the commands layer; simulations and tests
//! drive it with [`Machine::run`].
//!
//! What a search reports as it goes (a block taken in, a step decided) it
//! [`Port::emit`]s; the driver drains [`Machine::events`] before it runs the next block,
//! so a record written from them is up to date before every restart.

use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Context, Poll, Wake, Waker};

/// What the search and its driver hand each other.
struct Mailbox<Q, A, E> {
    asked: Option<Q>,
    answer: Option<A>,
    events: Vec<E>,
}

/// The search's side: ask for a block (`Q`), get its outcome (`A`); report events (`E`).
pub struct Port<Q, A, E>(Arc<Mutex<Mailbox<Q, A, E>>>);

impl<Q, A, E> Clone for Port<Q, A, E> {
    fn clone(&self) -> Self {
        Port(Arc::clone(&self.0))
    }
}

impl<Q: Unpin, A, E> Port<Q, A, E> {
    /// Ask the driver for one block and wait for what it gave.
    pub async fn ask(&self, question: Q) -> A {
        Ask {
            port: self,
            question: Some(question),
        }
        .await
    }
}

impl<Q, A, E> Port<Q, A, E> {
    /// Report `event` to the driver (drained by [`Machine::events`]).
    pub fn emit(&self, event: E) {
        self.lock().events.push(event);
    }

    fn lock(&self) -> MutexGuard<'_, Mailbox<Q, A, E>> {
        // A panic inside the search poisons nothing the driver could go on with.
        self.0
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

/// The one await point: pending once with the question posted, then until answered.
struct Ask<'p, Q, A, E> {
    port: &'p Port<Q, A, E>,
    question: Option<Q>,
}

impl<Q: Unpin, A, E> Future for Ask<'_, Q, A, E> {
    type Output = A;

    fn poll(mut self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<A> {
        let question = self.question.take();
        let mut mailbox = self.port.lock();
        if let Some(question) = question {
            mailbox.asked = Some(question);
            return Poll::Pending;
        }
        match mailbox.answer.take() {
            Some(answer) => Poll::Ready(answer),
            None => Poll::Pending,
        }
    }
}

/// What the search wants next.
#[derive(Debug, Clone, PartialEq)]
pub enum Next<Q, R> {
    /// Run this block and [`Machine::observe`] what it gave.
    Block(Q),
    /// The search ended with this.
    Done(R),
}

/// A search as a state machine: [`Machine::next_block`], run the block,
/// [`Machine::observe`], until [`Next::Done`].
pub struct Machine<Q, A, E, R> {
    search: Option<Pin<Box<dyn Future<Output = R> + Send>>>,
    port: Port<Q, A, E>,
    waiting: bool,
}

/// Wakes nothing: the search is only ever polled by [`Machine::next_block`].
struct Idle;

impl Wake for Idle {
    fn wake(self: Arc<Self>) {}
}

impl<Q: Unpin, A, E, R> Machine<Q, A, E, R> {
    /// The search `start` builds from its port; it does not run until the first
    /// [`Machine::next_block`].
    pub fn new<F>(start: impl FnOnce(Port<Q, A, E>) -> F) -> Self
    where
        F: Future<Output = R> + Send + 'static,
    {
        let port = Port(Arc::new(Mutex::new(Mailbox {
            asked: None,
            answer: None,
            events: Vec::new(),
        })));
        Machine {
            search: Some(Box::pin(start(port.clone()))),
            port,
            waiting: false,
        }
    }

    /// Run the search until it asks for a block or ends.
    ///
    /// # Panics
    /// When the last block asked for was not observed, or the search already ended: the
    /// driver's loop is wrong, not the data.
    pub fn next_block(&mut self) -> Next<Q, R> {
        assert!(
            !self.waiting,
            "next_block before the last block was observed"
        );
        let search = self
            .search
            .as_mut()
            .expect("next_block after the search ended");
        let waker = Waker::from(Arc::new(Idle));
        match search.as_mut().poll(&mut Context::from_waker(&waker)) {
            Poll::Ready(done) => {
                self.search = None;
                Next::Done(done)
            }
            Poll::Pending => {
                let question = self.port.lock().asked.take();
                self.waiting = true;
                Next::Block(question.expect("a search awaits nothing but its port"))
            }
        }
    }

    /// What the block asked for gave.
    ///
    /// # Panics
    /// When no block was asked for.
    pub fn observe(&mut self, answer: A) {
        assert!(self.waiting, "observe without a block asked for");
        self.port.lock().answer = Some(answer);
        self.waiting = false;
    }

    /// The events reported since the last call, in order.
    pub fn events(&mut self) -> Vec<E> {
        std::mem::take(&mut self.port.lock().events)
    }

    /// Drive the search to its end with a synchronous `run` (simulations, tests),
    /// handing every event to `event` as it comes.
    pub fn run(mut self, mut run: impl FnMut(&Q) -> A, mut event: impl FnMut(E)) -> R {
        loop {
            let next = self.next_block();
            self.events().into_iter().for_each(&mut event);
            match next {
                Next::Block(question) => {
                    let answer = run(&question);
                    self.observe(answer);
                }
                Next::Done(done) => return done,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Doubles numbers until the answer passes 20, saying each answer.
    fn doubling() -> Machine<u32, u32, String, u32> {
        Machine::new(|port| async move {
            let mut x = 1;
            while x <= 20 {
                x = port.ask(x).await;
                port.emit(format!("got {x}"));
            }
            x
        })
    }

    #[test]
    fn asks_one_block_at_a_time_and_ends_with_its_value() {
        let mut m = doubling();
        let mut asked = Vec::new();
        let done = loop {
            match m.next_block() {
                Next::Block(q) => {
                    asked.push(q);
                    m.observe(q * 2);
                }
                Next::Done(r) => break r,
            }
        };
        assert_eq!(asked, [1, 2, 4, 8, 16]);
        assert_eq!(done, 32);
        assert_eq!(m.events(), ["got 2", "got 4", "got 8", "got 16", "got 32"]);
    }

    #[test]
    fn events_come_before_the_next_block_is_run() {
        let mut seen = Vec::new();
        let done = doubling().run(|&q| q * 3, |e| seen.push(e));
        assert_eq!(done, 27);
        assert_eq!(seen, ["got 3", "got 9", "got 27"]);
    }

    #[test]
    #[should_panic(expected = "before the last block was observed")]
    fn a_block_not_observed_is_a_driver_bug() {
        let mut m = doubling();
        let _ = m.next_block();
        let _ = m.next_block();
    }
}
