//! The decode role's compute side: a paged pool accounting (capacity in tokens, pages
//! reserved per request for its prompt and its completion), a queue, and one compute
//! thread doing continuous batching: every step advances each running request by one
//! token through the read-back path (`model::decode_step`). Requests whose HTTP client
//! went away are dropped at the next step, so abandoned work stops burning CPU.

use super::backend::Backend;
use super::model::{decode_step, Generation, ReadPath, SequenceKv};
use parking_lot::{Condvar, Mutex};
use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Instant;
use tokio::sync::oneshot;

pub struct DecodeJob {
    pub generation: Generation,
    pub sequence: SequenceKv,
    pub cancelled: Arc<AtomicBool>,
    pub reply: oneshot::Sender<anyhow::Result<Generation>>,
    /// Streaming requests get every emitted token as soon as its step ends.
    pub tokens: Option<tokio::sync::mpsc::UnboundedSender<u32>>,
    /// How many of `generation.emitted` went to `tokens` already.
    pub streamed: usize,
}

#[derive(Default)]
pub struct DecodeStats {
    pub running: AtomicU64,
    pub queued: AtomicU64,
    pub used_tokens: AtomicU64,
    pub generated_tokens: AtomicU64,
    pub aborted: AtomicU64,
    pub eager_steps: AtomicU64,
    pub graph_steps: AtomicU64,
    /// Tokens/s over the last completed ~1 s window, f64 bits.
    pub throughput_bits: AtomicU64,
}

pub struct DecodeEngine {
    queue: Mutex<VecDeque<DecodeJob>>,
    wake: Condvar,
    pub stats: DecodeStats,
    pub pool_tokens: usize,
    pub page_tokens: usize,
}

impl DecodeEngine {
    pub fn new(pool_tokens: usize, page_tokens: usize) -> Arc<Self> {
        Arc::new(DecodeEngine {
            queue: Mutex::new(VecDeque::new()),
            wake: Condvar::new(),
            stats: DecodeStats::default(),
            pool_tokens,
            page_tokens,
        })
    }

    pub fn submit(&self, job: DecodeJob) {
        self.queue.lock().push_back(job);
        self.stats.queued.fetch_add(1, Ordering::Relaxed);
        self.wake.notify_one();
    }

    /// Pages a request reserves: its prompt plus its whole completion budget.
    fn reserved_tokens(&self, job: &DecodeJob) -> usize {
        (job.sequence.len() + job.generation.max_tokens()).div_ceil(self.page_tokens)
            * self.page_tokens
    }

    /// The compute loop (runs on its own thread until the process exits).
    pub fn run(self: Arc<Self>, backend: Box<dyn Backend>, path: ReadPath, max_running: usize) {
        let mut running: Vec<(DecodeJob, usize)> = Vec::new();
        let mut used = 0usize;
        let mut window_start = Instant::now();
        let mut window_tokens = 0u64;
        loop {
            {
                let mut queue = self.queue.lock();
                while running.is_empty() && queue.is_empty() {
                    self.wake.wait(&mut queue);
                }
                while running.len() < max_running {
                    let Some(job) = queue.front() else { break };
                    let need = self.reserved_tokens(job);
                    if used + need > self.pool_tokens && !running.is_empty() {
                        break;
                    }
                    let job = queue.pop_front().expect("front exists");
                    self.stats.queued.fetch_sub(1, Ordering::Relaxed);
                    used += need;
                    running.push((job, need));
                }
            }
            running.retain(|(job, need)| {
                let gone = job.cancelled.load(Ordering::Relaxed) || job.reply.is_closed();
                if gone {
                    used -= need;
                    self.stats.aborted.fetch_add(1, Ordering::Relaxed);
                }
                !gone
            });
            self.publish_batch(running.len(), used);
            if running.is_empty() {
                continue;
            }
            if running.len() > path.max_graph_batch {
                self.stats.eager_steps.fetch_add(1, Ordering::Relaxed);
            } else {
                self.stats.graph_steps.fetch_add(1, Ordering::Relaxed);
            }
            let before: usize = running
                .iter()
                .map(|(job, _)| job.generation.emitted.len())
                .sum();
            let mut batch: Vec<(&mut Generation, &mut SequenceKv)> = running
                .iter_mut()
                .map(|(job, _)| (&mut job.generation, &mut job.sequence))
                .collect();
            let outcome = decode_step(backend.as_ref(), &path, &mut batch);
            let after: usize = running
                .iter()
                .map(|(job, _)| job.generation.emitted.len())
                .sum();
            for (job, _) in running.iter_mut() {
                if let Some(tokens) = &job.tokens {
                    for &token in &job.generation.emitted[job.streamed..] {
                        let _ = tokens.send(token);
                    }
                    job.streamed = job.generation.emitted.len();
                }
            }
            let produced = (after - before) as u64;
            self.stats
                .generated_tokens
                .fetch_add(produced, Ordering::Relaxed);
            window_tokens += produced;
            let elapsed = window_start.elapsed().as_secs_f64();
            if elapsed >= 1.0 {
                self.stats.throughput_bits.store(
                    (window_tokens as f64 / elapsed).to_bits(),
                    Ordering::Relaxed,
                );
                window_start = Instant::now();
                window_tokens = 0;
            }
            if let Err(error) = outcome {
                used = 0;
                self.publish_batch(0, used);
                for (job, _) in running.drain(..) {
                    let _ = job
                        .reply
                        .send(Err(anyhow::anyhow!("decode step failed: {error:#}")));
                }
                continue;
            }
            let mut finished = Vec::new();
            let mut index = 0;
            while index < running.len() {
                if running[index].0.generation.finish.is_some() {
                    let (job, need) = running.swap_remove(index);
                    used -= need;
                    finished.push(job);
                } else {
                    index += 1;
                }
            }
            // The gauges drop before the replies go out: once the last reply is sent the
            // loop blocks waiting for work, so anything published after would never be.
            self.publish_batch(running.len(), used);
            for job in finished {
                let _ = job.reply.send(Ok(job.generation));
            }
        }
    }

    /// Publishes the running batch's size and pool use (and zero throughput once idle).
    fn publish_batch(&self, running: usize, used_tokens: usize) {
        self.stats.running.store(running as u64, Ordering::Relaxed);
        self.stats
            .used_tokens
            .store(used_tokens as u64, Ordering::Relaxed);
        if running == 0 {
            self.stats
                .throughput_bits
                .store(0f64.to_bits(), Ordering::Relaxed);
        }
    }
}
