//! Decode throughput of the embedded engine. Not a test: prints tables.
//!
//! `cargo bench --bench engine_decode`: the CPU backend's served decode step
//! (`model::decode_step`), tokens/s at batch 1, 16 and 64 over a ~1.5k-token context,
//! Mma vs Legacy attention path.
//!
//! `cargo bench --bench engine_decode -- --paged [--batches 1,16,64,256]
//! [--contexts 8192,32768] [--top-k 2048] [--steps 20] [--cpu-steps 2] [--hbm-gbps 4800]`:
//! one decode step through the paged backend contract (indexer top-k, then sparse
//! attention over the selection, KV resident in a pool), CPU backend vs CUDA backend
//! (when a GPU is found) on the same inputs, and the indexer call's effective
//! bandwidth (index-K bytes of the batch / time of the whole call, so a lower bound for
//! the kernel's) against `--hbm-gbps` (default: the H200 datasheet's 4.8 TB/s).
//! scripts/gpu-check.sh runs it on a device.

use bisect_engine::backend::cpu::CpuBackend;
use bisect_engine::backend::{AttnPath, Backend, IndexKDtype, TopkImpl};
use bisect_engine::keys;
use bisect_engine::model::{decode_step, plan, Generation, ReadPath, SequenceKv};
use std::time::Instant;

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.iter().any(|arg| arg == "--paged") {
        if let Err(error) = paged::run(&args) {
            eprintln!("engine_decode --paged: {error:#}");
            std::process::exit(1);
        }
        return;
    }
    let backend = CpuBackend::new();
    let context = 1536usize;
    let steps = 32usize;
    println!("| dtype | attention | batch | tokens/s |");
    println!("|---|---|---|---|");
    for dtype in [IndexKDtype::Bf16, IndexKDtype::Fp8] {
        for attn in [AttnPath::Mma, AttnPath::Legacy] {
            for batch in [1usize, 16, 64] {
                let path = ReadPath {
                    dtype,
                    top_k: 32,
                    topk: TopkImpl::V2,
                    attn,
                    max_graph_batch: 32,
                };
                let mut requests: Vec<(Generation, SequenceKv)> = (0..batch)
                    .map(|r| {
                        let tokens: Vec<u32> = (0..context as u32)
                            .map(|i| {
                                (i.wrapping_add(r as u32 * 7)).wrapping_mul(2_654_435_761) % 211
                            })
                            .collect();
                        let index = keys::index_keys(&tokens, 0);
                        let mut index_k = vec![0u8; context * dtype.bytes_per_token()];
                        backend
                            .quantize_index_k(dtype, &index, &mut index_k)
                            .expect("quantize");
                        let wanted: Vec<u32> = tokens[500..500 + steps].to_vec();
                        let sequence = SequenceKv {
                            truth: tokens.clone(),
                            stored_tokens: tokens.clone(),
                            main: keys::main_keys(&tokens, 0),
                            index_k,
                        };
                        (Generation::new(plan(&tokens, &wanted), steps), sequence)
                    })
                    .collect();
                let start = Instant::now();
                let mut produced = 0usize;
                for _ in 0..steps {
                    let mut view: Vec<_> = requests.iter_mut().map(|(g, s)| (g, s)).collect();
                    decode_step(&backend, &path, &mut view).expect("decode step");
                    produced += batch;
                }
                let rate = produced as f64 / start.elapsed().as_secs_f64();
                println!("| {} | {:?} | {batch} | {rate:.0} |", dtype.name(), attn);
            }
        }
    }
}

mod paged {
    use anyhow::{bail, ensure, Context, Result};
    use bisect_engine::backend::cpu::CpuBackend;
    use bisect_engine::backend::cuda::{probe, CudaBackend};
    use bisect_engine::backend::{
        AttnPath, Backend, IndexKDtype, PagedAttnJob, PagedIndexerJob, PagedPools, PoolId,
        PoolSpec, TopkImpl, INDEX_DIM, MAIN_DIM,
    };
    use std::time::Instant;

    const PAGE_TOKENS: usize = 64;

    struct Options {
        batches: Vec<usize>,
        contexts: Vec<usize>,
        top_k: usize,
        steps: usize,
        cpu_steps: usize,
        hbm_gbps: f64,
    }

    fn list(value: &str, flag: &str) -> Result<Vec<usize>> {
        value
            .split(',')
            .map(|v| {
                v.trim()
                    .parse::<usize>()
                    .with_context(|| format!("{flag} {value:?}: expected numbers like 1,16,64"))
            })
            .collect()
    }

    fn options(args: &[String]) -> Result<Options> {
        let mut options = Options {
            batches: vec![1, 16, 64, 256],
            contexts: vec![8192, 32768],
            top_k: 2048,
            steps: 20,
            cpu_steps: 2,
            hbm_gbps: 4800.0,
        };
        let mut iter = args.iter();
        while let Some(arg) = iter.next() {
            let mut value = |flag: &str| {
                iter.next()
                    .cloned()
                    .with_context(|| format!("{flag} needs a value"))
            };
            match arg.as_str() {
                "--paged" | "--bench" => {}
                "--batches" => options.batches = list(&value(arg)?, arg)?,
                "--contexts" => options.contexts = list(&value(arg)?, arg)?,
                "--top-k" => options.top_k = value(arg)?.parse().context("--top-k")?,
                "--steps" => options.steps = value(arg)?.parse().context("--steps")?,
                "--cpu-steps" => options.cpu_steps = value(arg)?.parse().context("--cpu-steps")?,
                "--hbm-gbps" => options.hbm_gbps = value(arg)?.parse().context("--hbm-gbps")?,
                other => {
                    bail!("unknown argument {other:?} (see the header of benches/engine_decode.rs)")
                }
            }
        }
        ensure!(
            options.steps > 0 && options.cpu_steps > 0,
            "--steps and --cpu-steps must be positive"
        );
        Ok(options)
    }

    /// SplitMix64: fast deterministic inputs, uniform in [-0.5, 0.5).
    struct Inputs(u64);
    impl Inputs {
        fn next(&mut self) -> f32 {
            self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
            let mut z = self.0;
            z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
            z ^= z >> 31;
            (z >> 40) as f32 / (1u64 << 24) as f32 - 0.5
        }
        fn fill(&mut self, out: &mut [f32]) {
            out.iter_mut().for_each(|v| *v = self.next());
        }
    }

    struct Batch {
        pages: Vec<Vec<u32>>,
        index_queries: Vec<Vec<f32>>,
        main_queries: Vec<Vec<f32>>,
        context: usize,
    }

    /// Same pages, same bytes in every backend: sequence s owns pages s * per .. (s + 1) * per.
    fn fill_pool(
        backend: &dyn Backend,
        spec: PoolSpec,
        batch: &Batch,
        seed: u64,
    ) -> Result<PoolId> {
        let pool = backend.create_pool(spec)?;
        let mut inputs = Inputs(seed);
        let mut main = vec![0.0f32; PAGE_TOKENS * MAIN_DIM];
        let mut index = vec![0.0f32; PAGE_TOKENS * INDEX_DIM];
        for pages in &batch.pages {
            for &page in pages {
                inputs.fill(&mut main);
                inputs.fill(&mut index);
                backend.write_rows(pool, page, 0, &main, &index)?;
            }
        }
        Ok(pool)
    }

    impl Batch {
        /// The batch's indexer jobs: each sequence's pages and index query.
        fn indexer_jobs(&self) -> Vec<PagedIndexerJob<'_>> {
            self.pages
                .iter()
                .zip(&self.index_queries)
                .map(|(pages, query)| PagedIndexerJob {
                    query,
                    pages,
                    n: self.context,
                })
                .collect()
        }
    }

    /// Seconds per step of `steps` decode steps (after one warm-up step), and the last
    /// step's selections.
    fn time_steps(
        backend: &dyn Backend,
        pool: PoolId,
        batch: &Batch,
        top_k: usize,
        steps: usize,
    ) -> Result<(f64, Vec<Vec<u32>>)> {
        let indexer = batch.indexer_jobs();
        let step = || -> Result<Vec<Vec<u32>>> {
            let selections =
                backend.indexer_topk_paged(pool, &indexer, top_k, TopkImpl::V2, false)?;
            let attention: Vec<PagedAttnJob<'_>> = batch
                .pages
                .iter()
                .zip(&batch.main_queries)
                .zip(&selections)
                .map(|((pages, query), selected)| PagedAttnJob {
                    query,
                    pages,
                    n: batch.context,
                    selected,
                })
                .collect();
            backend.sparse_attention_paged(pool, &attention, AttnPath::Mma)?;
            Ok(selections)
        };
        step()?;
        let started = Instant::now();
        let mut last = Vec::new();
        for _ in 0..steps {
            last = step()?;
        }
        Ok((started.elapsed().as_secs_f64() / steps as f64, last))
    }

    /// Seconds per indexer call (scores + top-k + transfers) over the whole batch.
    fn time_indexer(
        backend: &dyn Backend,
        pool: PoolId,
        batch: &Batch,
        top_k: usize,
        steps: usize,
    ) -> Result<f64> {
        let indexer = batch.indexer_jobs();
        backend.indexer_topk_paged(pool, &indexer, top_k, TopkImpl::V2, false)?;
        let started = Instant::now();
        for _ in 0..steps {
            backend.indexer_topk_paged(pool, &indexer, top_k, TopkImpl::V2, false)?;
        }
        Ok(started.elapsed().as_secs_f64() / steps as f64)
    }

    pub fn run(args: &[String]) -> Result<()> {
        let options = options(args)?;
        let cpu = CpuBackend::new();
        let gpu = match probe() {
            Some(description) => {
                println!("GPU: {description}");
                Some(CudaBackend::new().context("starting the CUDA backend")?)
            }
            None => {
                println!("GPU: none found; CPU column only");
                None
            }
        };
        println!(
            "paged decode step: indexer top-{} (V2) + Mma sparse attention; pages of {PAGE_TOKENS} rows; cpu {} steps, cuda {} steps",
            options.top_k, options.cpu_steps, options.steps
        );
        println!("| index-K | batch | ctx | cpu tokens/s | cuda tokens/s | cuda / cpu | indexer call GB/s | of HBM peak | same selections |");
        println!("|---|---|---|---|---|---|---|---|---|");
        for dtype in [IndexKDtype::Bf16, IndexKDtype::Fp8] {
            for &context in &options.contexts {
                for &size in &options.batches {
                    let per = context.div_ceil(PAGE_TOKENS);
                    let spec = PoolSpec {
                        dtype,
                        page_tokens: PAGE_TOKENS,
                        device_pages: size * per,
                        host_pages: 1,
                    };
                    let mut inputs = Inputs(0xbe7c ^ size as u64 ^ (context as u64) << 20);
                    let batch = Batch {
                        pages: (0..size)
                            .map(|s| ((s * per) as u32..((s + 1) * per) as u32).collect())
                            .collect(),
                        index_queries: (0..size)
                            .map(|_| {
                                let mut q = vec![0.0; INDEX_DIM];
                                inputs.fill(&mut q);
                                q
                            })
                            .collect(),
                        main_queries: (0..size)
                            .map(|_| {
                                let mut q = vec![0.0; MAIN_DIM];
                                inputs.fill(&mut q);
                                q
                            })
                            .collect(),
                        context,
                    };
                    let seed = 0x5eed ^ size as u64;
                    let cpu_pool = fill_pool(&cpu, spec, &batch, seed)?;
                    let (cpu_step, cpu_selected) =
                        time_steps(&cpu, cpu_pool, &batch, options.top_k, options.cpu_steps)?;
                    cpu.release_pool(cpu_pool)?;
                    let cpu_rate = size as f64 / cpu_step;
                    let (gpu_cells, same) = match gpu.as_ref() {
                        Some(gpu) => {
                            let pool = fill_pool(gpu, spec, &batch, seed)?;
                            let (step, selected) =
                                time_steps(gpu, pool, &batch, options.top_k, options.steps)?;
                            let indexer =
                                time_indexer(gpu, pool, &batch, options.top_k, options.steps)?;
                            gpu.release_pool(pool)?;
                            let rate = size as f64 / step;
                            let gbps =
                                (size * context * dtype.bytes_per_token()) as f64 / indexer / 1e9;
                            (
                                format!(
                                    "{rate:.0} | {:.1}x | {gbps:.0} | {:.1}%",
                                    rate / cpu_rate,
                                    100.0 * gbps / options.hbm_gbps
                                ),
                                if selected == cpu_selected {
                                    "yes"
                                } else {
                                    "NO"
                                },
                            )
                        }
                        None => ("- | - | - | -".to_string(), "-"),
                    };
                    println!(
                        "| {} | {size} | {context} | {cpu_rate:.1} | {gpu_cells} | {same} |",
                        dtype.name()
                    );
                    if same == "NO" {
                        bail!(
                            "{} batch {size} ctx {context}: CUDA selections differ from the CPU's",
                            dtype.name()
                        );
                    }
                }
            }
        }
        Ok(())
    }
}
