//! The decode role's compute side: a paged pool accounting (capacity in tokens, pages
//! reserved per request for its prompt and its completion), a queue, and one compute
//! thread doing continuous batching: every step advances each running request by one
//! token through the read-back path (`model::decode_step`). Requests whose HTTP client
//! went away are dropped at the next step, so abandoned work stops burning CPU.
//!
//! On the CUDA backend the KV of admitted requests is also made resident in one device
//! pool ([`ResidentPool`]): the prompt's rows are copied in once at admission, each new
//! token's row is appended, and steps read through page tables
//! (`model::decode_step_resident`), so a step uploads queries and page lists only. The
//! CPU backend keeps the host-slice path (`decode_step`), unchanged. A request that gets
//! no pages (pool full) runs on the host-slice path, in its own sub-batch.

use super::backend::{Backend, PoolId, PoolSpec};
use super::model::{decode_step, decode_step_resident, Generation, ReadPath, Resident, SequenceKv};
use parking_lot::{Condvar, Mutex};
use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Instant;
use tokio::sync::oneshot;

pub(crate) struct DecodeJob {
    pub(crate) generation: Generation,
    pub(crate) sequence: SequenceKv,
    pub(crate) cancelled: Arc<AtomicBool>,
    pub(crate) reply: oneshot::Sender<anyhow::Result<Generation>>,
    /// Streaming requests get every emitted token as soon as its step ends.
    pub(crate) tokens: Option<tokio::sync::mpsc::UnboundedSender<u32>>,
    /// How many of `generation.emitted` went to `tokens` already.
    pub(crate) streamed: usize,
}

#[derive(Default)]
pub(crate) struct DecodeStats {
    pub(crate) running: AtomicU64,
    pub(crate) queued: AtomicU64,
    pub(crate) used_tokens: AtomicU64,
    pub(crate) generated_tokens: AtomicU64,
    pub(crate) aborted: AtomicU64,
    pub(crate) eager_steps: AtomicU64,
    pub(crate) graph_steps: AtomicU64,
    /// Tokens/s over the last completed ~1 s window, f64 bits.
    pub(crate) throughput_bits: AtomicU64,
    /// Time `running` read above zero.
    pub(crate) busy: crate::metrics::BusyTime,
}

/// Decode's device pool on the CUDA backend: pages handed to running requests.
pub(crate) struct ResidentPool {
    pool: PoolId,
    page_tokens: usize,
    free: Vec<u32>,
}

impl ResidentPool {
    /// One pool of `pool_tokens` rows; `None` (with a warning) when it cannot be made.
    fn create(
        backend: &dyn Backend,
        path: &ReadPath,
        page_tokens: usize,
        pool_tokens: usize,
    ) -> Option<Self> {
        let spec = PoolSpec {
            dtype: path.dtype,
            page_tokens,
            device_pages: pool_tokens.div_ceil(page_tokens).max(1),
            host_pages: 1,
        };
        match backend.create_pool(spec) {
            Ok(pool) => Some(ResidentPool {
                pool,
                page_tokens,
                free: (0..spec.device_pages as u32).rev().collect(),
            }),
            Err(error) => {
                tracing::warn!(
                    "decode: no device-resident KV pool ({error:#}); reading host slices"
                );
                None
            }
        }
    }

    /// Pages for `reserved` rows, with the sequence's rows copied in; empty when the pool
    /// is short of pages or the copy fails (the request then reads host slices).
    fn admit(&mut self, backend: &dyn Backend, sequence: &SequenceKv, reserved: usize) -> Vec<u32> {
        let count = reserved.div_ceil(self.page_tokens);
        if count > self.free.len() || sequence.is_empty() {
            return Vec::new();
        }
        let pages = self.free.split_off(self.free.len() - count);
        let copied = sequence.store_in_pages(backend, self.pool, self.page_tokens, &pages);
        match copied {
            Ok(()) => pages,
            Err(error) => {
                tracing::warn!("decode: copying a prompt into the device pool failed ({error:#}); reading host slices");
                self.free.extend(pages);
                Vec::new()
            }
        }
    }

    fn release(&mut self, pages: &mut Vec<u32>) {
        self.free.append(pages);
    }
}

pub(crate) struct DecodeEngine {
    queue: Mutex<VecDeque<DecodeJob>>,
    wake: Condvar,
    pub(crate) stats: DecodeStats,
    pub(crate) pool_tokens: usize,
    pub(crate) page_tokens: usize,
}

impl DecodeEngine {
    pub(crate) fn new(pool_tokens: usize, page_tokens: usize) -> Arc<Self> {
        Arc::new(DecodeEngine {
            queue: Mutex::new(VecDeque::new()),
            wake: Condvar::new(),
            stats: DecodeStats::default(),
            pool_tokens,
            page_tokens,
        })
    }

    pub(crate) fn submit(&self, job: DecodeJob) {
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
    pub(crate) fn run(
        self: Arc<Self>,
        backend: Box<dyn Backend>,
        path: ReadPath,
        max_running: usize,
    ) {
        // The CPU backend reads host slices: its behaviour is the reference, unchanged.
        let mut resident = (backend.name() == "cuda")
            .then(|| {
                ResidentPool::create(backend.as_ref(), &path, self.page_tokens, self.pool_tokens)
            })
            .flatten();
        let mut running: Vec<(DecodeJob, usize, Vec<u32>)> = Vec::new();
        let mut used = 0usize;
        let mut window = (Instant::now(), 0u64);
        loop {
            self.admit_queued(
                &mut running,
                &mut used,
                &mut resident,
                backend.as_ref(),
                max_running,
            );
            self.drop_abandoned(&mut running, &mut used, &mut resident);
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
                .map(|(job, _, _)| job.generation.emitted.len())
                .sum();
            let outcome = step_running(backend.as_ref(), &path, resident.as_ref(), &mut running);
            let after: usize = running
                .iter()
                .map(|(job, _, _)| job.generation.emitted.len())
                .sum();
            stream_new_tokens(&mut running);
            self.count_tokens((after - before) as u64, &mut window);
            if let Err(error) = outcome {
                self.fail_running(&mut running, &mut used, &mut resident, &error);
                continue;
            }
            let finished = take_finished(&mut running, &mut used, &mut resident);
            // The gauges drop before the replies go out: once the last reply is sent the
            // loop blocks waiting for work, so anything published after would never be.
            self.publish_batch(running.len(), used);
            for job in finished {
                let _ = job.reply.send(Ok(job.generation));
            }
        }
    }

    /// Block until there is work, then admit queued requests in order while the batch
    /// has room and the pool has their reservation (the first always fits an empty
    /// batch, so an oversized request still runs alone).
    fn admit_queued(
        &self,
        running: &mut Vec<(DecodeJob, usize, Vec<u32>)>,
        used: &mut usize,
        resident: &mut Option<ResidentPool>,
        backend: &dyn Backend,
        max_running: usize,
    ) {
        let mut queue = self.queue.lock();
        while running.is_empty() && queue.is_empty() {
            self.wake.wait(&mut queue);
        }
        while running.len() < max_running {
            let Some(job) = queue.front() else { break };
            let need = self.reserved_tokens(job);
            if *used + need > self.pool_tokens && !running.is_empty() {
                break;
            }
            let job = queue.pop_front().expect("front exists");
            self.stats.queued.fetch_sub(1, Ordering::Relaxed);
            *used += need;
            let pages = match resident.as_mut() {
                Some(pool) => pool.admit(backend, &job.sequence, need),
                None => Vec::new(),
            };
            running.push((job, need, pages));
        }
    }

    /// Drop the requests whose client went away (cancelled, or its reply channel
    /// closed), giving back their reservation and pages.
    fn drop_abandoned(
        &self,
        running: &mut Vec<(DecodeJob, usize, Vec<u32>)>,
        used: &mut usize,
        resident: &mut Option<ResidentPool>,
    ) {
        running.retain_mut(|(job, need, pages)| {
            let gone = job.cancelled.load(Ordering::Relaxed) || job.reply.is_closed();
            if gone {
                *used -= *need;
                self.stats.aborted.fetch_add(1, Ordering::Relaxed);
                if let Some(pool) = resident.as_mut() {
                    pool.release(pages);
                }
            }
            !gone
        });
    }

    /// A failed step fails the whole batch: every running request gets the error and
    /// gives back its pages.
    fn fail_running(
        &self,
        running: &mut Vec<(DecodeJob, usize, Vec<u32>)>,
        used: &mut usize,
        resident: &mut Option<ResidentPool>,
        error: &anyhow::Error,
    ) {
        *used = 0;
        self.publish_batch(0, *used);
        for (job, _, mut pages) in running.drain(..) {
            if let Some(pool) = resident.as_mut() {
                pool.release(&mut pages);
            }
            let _ = job
                .reply
                .send(Err(anyhow::anyhow!("decode step failed: {error:#}")));
        }
    }

    /// Counts a step's new tokens; the throughput gauge is their rate over a window
    /// (start, tokens) of at least a second.
    fn count_tokens(&self, produced: u64, window: &mut (Instant, u64)) {
        self.stats
            .generated_tokens
            .fetch_add(produced, Ordering::Relaxed);
        window.1 += produced;
        let elapsed = window.0.elapsed().as_secs_f64();
        if elapsed >= 1.0 {
            self.stats
                .throughput_bits
                .store((window.1 as f64 / elapsed).to_bits(), Ordering::Relaxed);
            *window = (Instant::now(), 0);
        }
    }

    /// Publishes the running batch's size and pool use (and zero throughput once idle).
    fn publish_batch(&self, running: usize, used_tokens: usize) {
        self.stats.running.store(running as u64, Ordering::Relaxed);
        self.stats.busy.publish(running);
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

/// Take the requests that finished this step out of the batch, giving back their
/// reservation and pages; their replies go out once the gauges are published.
fn take_finished(
    running: &mut Vec<(DecodeJob, usize, Vec<u32>)>,
    used: &mut usize,
    resident: &mut Option<ResidentPool>,
) -> Vec<DecodeJob> {
    let mut finished = Vec::new();
    let mut index = 0;
    while index < running.len() {
        if running[index].0.generation.finish.is_some() {
            let (job, need, mut pages) = running.swap_remove(index);
            *used -= need;
            if let Some(pool) = resident.as_mut() {
                pool.release(&mut pages);
            }
            finished.push(job);
        } else {
            index += 1;
        }
    }
    finished
}

/// Sends each streaming request the tokens its last step emitted.
fn stream_new_tokens(running: &mut [(DecodeJob, usize, Vec<u32>)]) {
    for (job, _, _) in running.iter_mut() {
        if let Some(tokens) = &job.tokens {
            for &token in &job.generation.emitted[job.streamed..] {
                let _ = tokens.send(token);
            }
            job.streamed = job.generation.emitted.len();
        }
    }
}

/// One step of every running request: those with pages through the device pool, the
/// others through host slices (two sub-batches, so each sequence keeps one source).
fn step_running(
    backend: &dyn Backend,
    path: &ReadPath,
    resident: Option<&ResidentPool>,
    running: &mut [(DecodeJob, usize, Vec<u32>)],
) -> anyhow::Result<()> {
    let mut on_host: Vec<(&mut Generation, &mut SequenceKv)> = Vec::new();
    let mut on_device: Vec<(&mut Generation, &mut SequenceKv)> = Vec::new();
    let mut page_lists: Vec<&[u32]> = Vec::new();
    for (job, _, pages) in running.iter_mut() {
        if pages.is_empty() {
            on_host.push((&mut job.generation, &mut job.sequence));
        } else {
            on_device.push((&mut job.generation, &mut job.sequence));
            page_lists.push(pages);
        }
    }
    if !on_host.is_empty() {
        decode_step(backend, path, &mut on_host)?;
    }
    if let (Some(pool), false) = (resident, on_device.is_empty()) {
        let placement = Resident {
            pool: pool.pool,
            page_tokens: pool.page_tokens,
            pages: &page_lists,
        };
        decode_step_resident(backend, path, &placement, &mut on_device)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::cpu::CpuBackend;
    use crate::backend::IndexKDtype;
    use crate::keys;
    use crate::model::plan;

    fn job(tokens: &[u32], wanted: &[u32], dtype: IndexKDtype) -> DecodeJob {
        let backend = CpuBackend::new();
        let mut index_k = vec![0u8; tokens.len() * dtype.bytes_per_token()];
        backend
            .quantize_index_k(dtype, &keys::index_keys(tokens, 0), &mut index_k)
            .unwrap();
        DecodeJob {
            generation: Generation::new(plan(tokens, wanted), 40),
            sequence: SequenceKv {
                truth: tokens.to_vec(),
                stored_tokens: tokens.to_vec(),
                main: keys::main_keys(tokens, 0),
                index_k,
            },
            cancelled: Arc::new(AtomicBool::new(false)),
            reply: oneshot::channel().0,
            tokens: None,
            streamed: 0,
        }
    }

    /// The CUDA path's bookkeeping, run on the CPU backend's pools: a resident request
    /// and a host-slice one in the same step emit what host slices alone emit.
    #[test]
    fn resident_and_host_requests_step_together_and_pages_come_back() {
        mixed_step(&CpuBackend::new());
    }

    /// The same on the GPU (skipped without one): resident reads through the device
    /// pool's page tables emit the CPU's tokens.
    #[test]
    fn gpu_resident_decode_emits_the_cpu_tokens() {
        if crate::backend::cuda::probe().is_none() {
            eprintln!("skipped: no CUDA device");
            return;
        }
        mixed_step(&crate::backend::cuda::CudaBackend::new().unwrap());
    }

    fn mixed_step(backend: &dyn Backend) {
        let dtype = IndexKDtype::Fp8;
        let path = crate::model::tests::mma_path(dtype, 32);
        let tokens: Vec<u32> = (0..300u32).map(|i| ((i * 7919) >> 3) % 89).collect();
        let wanted = [tokens[200..230].to_vec(), tokens[10..25].to_vec()];
        let mut pool = ResidentPool::create(backend, &path, 64, 7 * 64).unwrap();
        let mut running: Vec<(DecodeJob, usize, Vec<u32>)> = wanted
            .iter()
            .map(|w| {
                let job = job(&tokens, w, dtype);
                // As `reserved_tokens`: 300 + 40 rounded up to pages, 6 pages each; the
                // pool has 7, so the second request stays on the host.
                let need = 384;
                let pages = pool.admit(backend, &job.sequence, need);
                (job, need, pages)
            })
            .collect();
        assert_eq!(running[0].2.len(), 6);
        assert!(running[1].2.is_empty());
        assert_eq!(pool.free.len(), 1);
        while running
            .iter()
            .any(|(job, _, _)| job.generation.finish.is_none())
        {
            step_running(backend, &path, Some(&pool), &mut running).unwrap();
        }
        for ((job, _, _), w) in running.iter().zip(&wanted) {
            assert_eq!(&job.generation.emitted, w);
        }
        for (_, _, pages) in running.iter_mut() {
            pool.release(pages);
        }
        assert_eq!(pool.free.len(), 7);
    }
}
