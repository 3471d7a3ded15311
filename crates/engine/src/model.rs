//! The miniature model: a deterministic agent whose every emitted token is read back
//! through the KV cache.
//!
//! The agent reads the task (the last user message with numbered `name(key=value, ...)`
//! lines), counts the tool results after it to know the current step, and decides the
//! text it wants to say: one canonical DSML call for the next step, or the final answer
//! the task asks for. It then plans that text as copies of context spans (longest match,
//! earliest occurrence: DSML tags from the system section's format example, tool names
//! and values from the task line). Generation reads every token back: the query is the
//! key of the target position computed from the request text, the indexer scores all
//! stored index-K rows and keeps the top-k, sparse attention over the main keys of the
//! selection picks a position, and the token stored there is emitted. Like an induction
//! head, the next target of a span is the position actually selected plus one, so one
//! wrong pick derails the rest of the span into the wrong neighbourhood.

use super::backend::{
    AppendedRows, AttnJob, AttnOut, AttnPath, Backend, IndexKDtype, IndexRows, IndexerJob,
    IndexerRead, PageRows, PagedAttnJob, PagedIndexerJob, PoolId, TopkImpl, INDEX_DIM, MAIN_DIM,
};
use super::keys;
use super::template::{Conversation, Turn};
use regex::Regex;
use serde_json::{Map, Value};
use std::collections::HashMap;
use std::sync::OnceLock;

/// Indexer top-k of the engine.
pub(crate) const DEFAULT_TOP_K: usize = 32;

/// One step of the task: a tool name and its arguments.
pub(crate) type Step = (String, Map<String, Value>);

#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Task {
    pub(crate) steps: Vec<Step>,
    /// What to answer once every step is done.
    pub(crate) answer: String,
}

/// What the agent wants to say this round.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Intent {
    Call(Step),
    Answer(String),
}

fn step_line() -> &'static Regex {
    static RE: OnceLock<Regex> = OnceLock::new();
    RE.get_or_init(|| {
        Regex::new(r"^\s*\d+\.\s*([A-Za-z_][A-Za-z0-9_]*)\((.*)\)\s*$")
            .expect("step regex is valid")
    })
}

/// `key=JSON, key=JSON` -> an object; None if any argument does not parse.
fn parse_arguments(text: &str) -> Option<Map<String, Value>> {
    let mut arguments = Map::new();
    let mut rest = text.trim();
    while !rest.is_empty() {
        let (key, after) = rest.split_once('=')?;
        let key = key.trim();
        if key.is_empty() || !key.chars().all(|c| c.is_alphanumeric() || c == '_') {
            return None;
        }
        let mut values = serde_json::Deserializer::from_str(after).into_iter::<Value>();
        let value = values.next()?.ok()?;
        let consumed = values.byte_offset();
        arguments.insert(key.to_string(), value);
        rest = after[consumed..].trim_start();
        if let Some(stripped) = rest.strip_prefix(',') {
            rest = stripped.trim_start();
        } else if !rest.is_empty() {
            return None;
        }
    }
    Some(arguments)
}

/// Parse a task message; None if it has no numbered steps.
pub(crate) fn parse_task(text: &str) -> Option<Task> {
    let mut steps = Vec::new();
    let mut last_step_line = None;
    for (index, line) in text.lines().enumerate() {
        if let Some(captures) = step_line().captures(line) {
            if let Some(arguments) = parse_arguments(&captures[2]) {
                steps.push((captures[1].to_string(), arguments));
                last_step_line = Some(index);
            }
        }
    }
    let after: Vec<&str> = text
        .lines()
        .skip(last_step_line? + 1)
        .map(str::trim)
        .filter(|line| !line.is_empty())
        .collect();
    let closing = after.last().copied().unwrap_or("Done.");
    let answer = match closing.find("reply exactly:") {
        Some(at) => closing[at + "reply exactly:".len()..].trim().to_string(),
        None => closing.to_string(),
    };
    Some(Task { steps, answer })
}

/// The agent's decision for this round; None when the conversation holds no task.
pub(crate) fn decide(conversation: &Conversation) -> Option<Intent> {
    let (task_index, task) =
        conversation
            .messages
            .iter()
            .enumerate()
            .rev()
            .find_map(|(index, turn)| match turn {
                Turn::User(text) => parse_task(text).map(|task| (index, task)),
                _ => None,
            })?;
    let done = conversation.messages[task_index + 1..]
        .iter()
        .filter(|turn| matches!(turn, Turn::Tool(_)))
        .count();
    Some(match task.steps.get(done) {
        Some(step) => Intent::Call(step.clone()),
        None => Intent::Answer(task.answer),
    })
}

/// Said when the conversation holds no numbered task (mostly not copyable: literals).
pub(crate) const NO_TASK_REPLY: &str = "I found no numbered task steps in this conversation.";

/// Render the prompt and plan this round's output: the prompt tokens and the
/// generation that will read the output back through the KV cache.
pub(crate) fn prepare(
    conversation: &Conversation,
    vocab: &super::tokenizer::Vocab,
) -> (Vec<u32>, Generation) {
    let prompt = super::template::render(conversation, vocab);
    let wanted_text = match decide(conversation) {
        Some(Intent::Call(step)) => super::dsml::render_calls(&[step]),
        Some(Intent::Answer(answer)) => answer,
        None => NO_TASK_REPLY.to_string(),
    };
    let wanted = vocab.encode(&wanted_text);
    let generation = Generation::new(plan(&prompt, &wanted), conversation.max_tokens);
    (prompt, generation)
}

/// One piece of the output plan.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Piece {
    /// Copy `len` tokens starting at context position `anchor`.
    Copy { anchor: usize, len: usize },
    /// A token found nowhere in the context: emitted without a memory read.
    Literal(u32),
}

/// Plan `wanted` as copies from `context`: at each point the longest matching span,
/// the earliest one on ties.
pub fn plan(context: &[u32], wanted: &[u32]) -> Vec<Piece> {
    let mut occurrences: HashMap<u32, Vec<usize>> = HashMap::new();
    for (position, token) in context.iter().enumerate() {
        occurrences.entry(*token).or_default().push(position);
    }
    let mut pieces = Vec::new();
    let mut index = 0;
    while index < wanted.len() {
        let mut best: Option<(usize, usize)> = None;
        for &start in occurrences
            .get(&wanted[index])
            .map(Vec::as_slice)
            .unwrap_or(&[])
        {
            let len = context[start..]
                .iter()
                .zip(&wanted[index..])
                .take_while(|(a, b)| a == b)
                .count();
            if best.is_none_or(|(_, best_len)| len > best_len) {
                best = Some((start, len));
            }
        }
        match best {
            Some((anchor, len)) => {
                pieces.push(Piece::Copy { anchor, len });
                index += len;
            }
            None => {
                pieces.push(Piece::Literal(wanted[index]));
                index += 1;
            }
        }
    }
    pieces
}

/// A sequence's memory as decode holds it: the true tokens (what decode tokenized and
/// emitted) and the stored rows (shipped by prefill, then appended by decode).
#[derive(Debug, Clone, Default)]
pub struct SequenceKv {
    pub truth: Vec<u32>,
    /// Token id stored with each main-KV row.
    pub stored_tokens: Vec<u32>,
    /// MAIN_DIM f32 per row.
    pub main: Vec<f32>,
    /// dtype.bytes_per_token() per row.
    pub index_k: Vec<u8>,
}

impl SequenceKv {
    pub fn len(&self) -> usize {
        self.stored_tokens.len()
    }

    pub fn is_empty(&self) -> bool {
        self.stored_tokens.is_empty()
    }

    /// Copies the rows into `pages` of `pool` (`page_tokens` rows a page), the index-K
    /// bytes as they are: how decode makes an admitted prompt resident.
    pub(crate) fn store_in_pages(
        &self,
        backend: &dyn Backend,
        pool: PoolId,
        page_tokens: usize,
        pages: &[u32],
    ) -> anyhow::Result<()> {
        let width = self.index_k.len() / self.len();
        (0..self.len())
            .step_by(page_tokens)
            .zip(pages)
            .try_for_each(|(start, &page)| {
                let end = (start + page_tokens).min(self.len());
                let rows = PageRows {
                    page,
                    first_row: 0,
                    main_keys: &self.main[start * MAIN_DIM..end * MAIN_DIM],
                    index: IndexRows::Quantized(&self.index_k[start * width..end * width]),
                };
                backend.store_rows(pool, rows)
            })
    }

    /// Appends a generated token with its own main key and quantized index key, and
    /// returns the new row's main and index keys (f32), for a copy of the sequence
    /// resident in a backend pool.
    ///
    /// The host row is quantized by the shared layout code (what the CPU backend runs,
    /// and what every backend matches bit for bit), not through `backend`: on a GPU
    /// that would be a device round trip per token, and the resident copy is quantized
    /// on the device by `append_rows` anyway.
    fn append_keys(
        &mut self,
        _backend: &dyn Backend,
        dtype: IndexKDtype,
        token: u32,
    ) -> anyhow::Result<([f32; MAIN_DIM], [f32; INDEX_DIM])> {
        let position = self.truth.len();
        let previous = keys::previous_token(&self.truth, position);
        let mut index_key = [0.0f32; INDEX_DIM];
        let mut main_key = [0.0f32; MAIN_DIM];
        keys::index_key(previous, token, position, &mut index_key);
        keys::main_key(previous, token, position, &mut main_key);
        let mut row = vec![0u8; dtype.bytes_per_token()];
        super::backend::layout::quantize_row(dtype, &index_key, &mut row);
        self.truth.push(token);
        self.stored_tokens.push(token);
        self.main.extend_from_slice(&main_key);
        self.index_k.extend_from_slice(&row);
        Ok((main_key, index_key))
    }
}

/// Where a batch's sequences also live in a backend pool (decode with `--device cuda`):
/// page lists parallel to the batch, each long enough for the sequence's whole budget.
/// Reads go through the page tables; appended rows are written to the pool too.
pub(crate) struct Resident<'a> {
    pub(crate) pool: PoolId,
    pub(crate) page_tokens: usize,
    pub(crate) pages: &'a [&'a [u32]],
}

/// New rows of a step for the pool of a resident batch, appended in one call at the end
/// of the step (no read of the step needs them: a sequence that emits a literal does not
/// read in that step).
#[derive(Default)]
struct PoolAppends {
    rows: Vec<(u32, usize)>,
    main: Vec<f32>,
    index: Vec<f32>,
}

/// Append `token` to the sequence in `slot`, and queue its row for the pool pages when
/// resident.
fn append_token(
    backend: &dyn Backend,
    dtype: IndexKDtype,
    resident: Option<&Resident<'_>>,
    appends: &mut PoolAppends,
    slot: usize,
    sequence: &mut SequenceKv,
    token: u32,
) -> anyhow::Result<()> {
    let (main_key, index_key) = sequence.append_keys(backend, dtype, token)?;
    if let Some(resident) = resident {
        let position = sequence.len() - 1;
        let pages = resident.pages[slot];
        let page = *pages.get(position / resident.page_tokens).ok_or_else(|| {
            anyhow::anyhow!(
                "row {position} is past the {} pages reserved for this sequence",
                pages.len()
            )
        })?;
        appends.rows.push((page, position % resident.page_tokens));
        appends.main.extend_from_slice(&main_key);
        appends.index.extend_from_slice(&index_key);
    }
    Ok(())
}

/// Appends the step's new rows to the pool of a resident batch.
fn flush(
    backend: &dyn Backend,
    resident: Option<&Resident<'_>>,
    appends: &PoolAppends,
) -> anyhow::Result<()> {
    match resident {
        Some(resident) if !appends.rows.is_empty() => {
            let rows = AppendedRows {
                rows: &appends.rows,
                main_keys: &appends.main,
                index_keys: &appends.index,
            };
            backend.append_rows(resident.pool, rows)
        }
        _ => Ok(()),
    }
}

/// Knobs of the read-back path (all from flags; none changes results except dtype).
#[derive(Debug, Clone, Copy)]
pub struct ReadPath {
    pub dtype: IndexKDtype,
    pub top_k: usize,
    pub topk: TopkImpl,
    pub attn: AttnPath,
    /// Batches larger than this run request by request ("eager"), same results.
    pub max_graph_batch: usize,
}

/// Why a generation stopped.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Finish {
    Complete,
    Length,
}

/// One emitted token's log-probability and its best alternatives (tokens with theirs,
/// highest first), as the server reports them when a request asks for `logprobs`.
///
/// A read's distribution is attention's softmax over the indexer's selection; a token's
/// log-probability is that of the best position storing it, because the engine emits the
/// token at the best position (greedy over positions): so the emitted token is always the
/// first alternative, as greedy decoding's is, and its margin over the runner-up is the
/// lead its position had over the best position storing another token. Only the best
/// [`super::backend::CANDIDATES`] positions are read. A literal (a token the plan emits without reading) is certain: log-probability
/// 0 and no alternative. Each number comes from the request's own rows and selection
/// (fixed reduction order per sequence), so it is the same alone and in any batch.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct TokenProb {
    pub(crate) logprob: f32,
    pub(crate) top: Vec<(u32, f32)>,
}

impl TokenProb {
    /// A token the plan emits without reading memory.
    fn certain(token: u32) -> Self {
        TokenProb {
            logprob: 0.0,
            top: vec![(token, 0.0)],
        }
    }

    /// The read's distribution over tokens from the selection's best positions; `None`
    /// when the backend reported none (the argmax only).
    fn of_read(token: u32, candidates: &[(u32, f32)], stored: &[u32]) -> Option<Self> {
        let mut by_token: Vec<(u32, f32)> = Vec::new();
        for &(position, weight) in candidates {
            let Some(&t) = stored.get(position as usize) else {
                continue;
            };
            // Candidates come best first: a token's first position is its best.
            if !by_token.iter().any(|(seen, _)| *seen == t) {
                by_token.push((t, weight));
            }
        }
        let chosen = by_token.iter().find(|(t, _)| *t == token)?.1;
        by_token.sort_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
        Some(TokenProb {
            logprob: chosen.ln(),
            top: by_token.into_iter().map(|(t, w)| (t, w.ln())).collect(),
        })
    }
}

/// One request's generation state.
#[derive(Debug, Clone)]
pub struct Generation {
    pieces: Vec<Piece>,
    piece: usize,
    offset: usize,
    last_selected: usize,
    max_tokens: usize,
    pub(crate) emitted: Vec<u32>,
    /// One per emitted token when the request asked for log-probabilities
    /// ([`Generation::keep_probs`]): its log-probability, or `None` where the backend gave
    /// no distribution. Empty otherwise: a request that did not ask pays nothing.
    pub(crate) probs: Vec<Option<TokenProb>>,
    keep_probs: bool,
    pub(crate) finish: Option<Finish>,
}

impl Generation {
    pub fn new(pieces: Vec<Piece>, max_tokens: usize) -> Self {
        let finish = if pieces.is_empty() {
            Some(Finish::Complete)
        } else {
            None
        };
        Generation {
            pieces,
            piece: 0,
            offset: 0,
            last_selected: 0,
            max_tokens,
            emitted: Vec::new(),
            probs: Vec::new(),
            keep_probs: false,
            finish,
        }
    }

    /// Keep each emitted token's log-probability (the request asked for `logprobs`).
    pub(crate) fn keep_probs(&mut self) {
        self.keep_probs = true;
    }

    /// Record the log-probability of the token just emitted, when asked to.
    fn push_prob(&mut self, prob: impl FnOnce() -> Option<TokenProb>) {
        if self.keep_probs {
            self.probs.push(prob());
        }
    }

    pub(crate) fn max_tokens(&self) -> usize {
        self.max_tokens
    }

    /// Emit the planned token without reading memory: the simulation's timing model for
    /// prefill-only runs (never used by the servers).
    #[cfg(test)]
    pub(crate) fn emit_planned(&mut self, truth: &[u32]) {
        if self.finish.is_some() {
            return;
        }
        match self.pieces.get(self.piece).copied() {
            Some(Piece::Copy { anchor, .. }) => {
                self.last_selected = anchor + self.offset;
                self.emitted.push(truth[self.last_selected]);
                self.push_prob(|| None);
            }
            Some(Piece::Literal(token)) => {
                self.emitted.push(token);
                self.push_prob(|| Some(TokenProb::certain(token)));
            }
            None => {}
        }
        self.advance();
        self.check_finished();
    }

    fn advance(&mut self) {
        self.offset += 1;
        if let Some(Piece::Copy { len, .. }) = self.pieces.get(self.piece) {
            if self.offset < *len {
                return;
            }
        }
        self.piece += 1;
        self.offset = 0;
    }

    fn check_finished(&mut self) {
        if self.piece >= self.pieces.len() {
            self.finish = Some(Finish::Complete);
        } else if self.emitted.len() >= self.max_tokens {
            self.finish = Some(Finish::Length);
        }
    }

    /// The context position this step must read (None: emit a literal or end).
    fn target(&mut self, sequence_len: usize) -> Option<Result<usize, u32>> {
        loop {
            match *self.pieces.get(self.piece)? {
                Piece::Literal(token) => return Some(Err(token)),
                Piece::Copy { anchor, .. } => {
                    let target = if self.offset == 0 {
                        anchor
                    } else {
                        self.last_selected + 1
                    };
                    if target < sequence_len {
                        return Some(Ok(target));
                    }
                    // Derailed onto the newest row: nothing follows it, the span ends.
                    self.piece += 1;
                    self.offset = 0;
                }
            }
        }
    }
}

/// Advance every unfinished generation by one token (continuous batching step).
pub fn decode_step(
    backend: &dyn Backend,
    path: &ReadPath,
    batch: &mut [(&mut Generation, &mut SequenceKv)],
) -> anyhow::Result<()> {
    step(backend, path, None, batch)
}

/// [`decode_step`] with the batch's KV read from a backend pool through page tables
/// (only queries, page lists and results cross to the device). Same tokens as
/// `decode_step` on the same rows.
pub(crate) fn decode_step_resident(
    backend: &dyn Backend,
    path: &ReadPath,
    resident: &Resident<'_>,
    batch: &mut [(&mut Generation, &mut SequenceKv)],
) -> anyhow::Result<()> {
    anyhow::ensure!(
        resident.pages.len() == batch.len(),
        "{} page lists for a batch of {}",
        resident.pages.len(),
        batch.len()
    );
    step(backend, path, Some(resident), batch)
}

/// One read-back of a step: the batch slot, the position it targets, and the queries
/// computed from the request text for it.
struct Read {
    slot: usize,
    target: usize,
    index_query: Vec<f32>,
    main_query: Vec<f32>,
}

fn step(
    backend: &dyn Backend,
    path: &ReadPath,
    resident: Option<&Resident<'_>>,
    batch: &mut [(&mut Generation, &mut SequenceKv)],
) -> anyhow::Result<()> {
    let mut appends = PoolAppends::default();
    let mut reads = Vec::new();
    for (slot, (generation, sequence)) in batch.iter_mut().enumerate() {
        if generation.finish.is_some() {
            continue;
        }
        match generation.target(sequence.len()) {
            None => generation.check_finished(),
            Some(Err(literal)) => {
                append_token(
                    backend,
                    path.dtype,
                    resident,
                    &mut appends,
                    slot,
                    sequence,
                    literal,
                )?;
                generation.emitted.push(literal);
                generation.push_prob(|| Some(TokenProb::certain(literal)));
                generation.advance();
                generation.check_finished();
            }
            Some(Ok(target)) => {
                let previous = keys::previous_token(&sequence.truth, target);
                let mut index_query = vec![0.0f32; INDEX_DIM];
                let mut main_query = vec![0.0f32; MAIN_DIM];
                keys::index_key(previous, sequence.truth[target], target, &mut index_query);
                keys::main_key(previous, sequence.truth[target], target, &mut main_query);
                reads.push(Read {
                    slot,
                    target,
                    index_query,
                    main_query,
                });
            }
        }
    }
    if reads.is_empty() {
        return flush(backend, resident, &appends);
    }
    let groups: Vec<&[Read]> = if reads.len() > path.max_graph_batch {
        reads.chunks(1).collect()
    } else {
        vec![&reads[..]]
    };
    let mut picks = Vec::with_capacity(reads.len());
    for group in groups {
        let outputs = read_group(backend, path, resident, batch, group)?;
        picks.extend(
            outputs
                .into_iter()
                .map(|out| (out.argmax as usize, out.candidates)),
        );
    }
    for (read, (selected, candidates)) in reads.iter().zip(picks) {
        let (generation, sequence) = &mut batch[read.slot];
        debug_assert!(read.target < sequence.len());
        let token = sequence.stored_tokens[selected];

        append_token(
            backend,
            path.dtype,
            resident,
            &mut appends,
            read.slot,
            sequence,
            token,
        )?;
        generation.emitted.push(token);
        generation.push_prob(|| TokenProb::of_read(token, &candidates, &sequence.stored_tokens));
        generation.last_selected = selected;
        generation.advance();
        generation.check_finished();
    }
    flush(backend, resident, &appends)
}

/// The indexer, then sparse attention over its selection, for one group of a step's
/// reads: through host slices, or through the pool's page tables when resident.
fn read_group(
    backend: &dyn Backend,
    path: &ReadPath,
    resident: Option<&Resident<'_>>,
    batch: &[(&mut Generation, &mut SequenceKv)],
    group: &[Read],
) -> anyhow::Result<Vec<AttnOut>> {
    let selections = match resident {
        None => {
            let index_jobs: Vec<IndexerJob<'_>> = group
                .iter()
                .map(|read| {
                    let sequence = &batch[read.slot].1;
                    IndexerJob {
                        query: &read.index_query,
                        index_k: &sequence.index_k,
                        n: sequence.len(),
                    }
                })
                .collect();
            let read = IndexerRead {
                dtype: path.dtype,
                k: path.top_k,
                topk: path.topk,
            };
            backend.indexer_topk(&index_jobs, read)?
        }
        Some(resident) => {
            let index_jobs: Vec<PagedIndexerJob<'_>> = group
                .iter()
                .map(|read| PagedIndexerJob {
                    query: &read.index_query,
                    pages: resident.pages[read.slot],
                    n: batch[read.slot].1.len(),
                })
                .collect();
            // Decode's pool has no load-backs: nothing to gate.
            backend.indexer_topk_paged(resident.pool, &index_jobs, path.top_k, path.topk, false)?
        }
    };
    let outputs = match resident {
        None => {
            let attn_jobs: Vec<AttnJob<'_>> = group
                .iter()
                .zip(&selections)
                .map(|(read, selected)| {
                    let sequence = &batch[read.slot].1;
                    AttnJob {
                        query: &read.main_query,
                        keys: &sequence.main,
                        n: sequence.len(),
                        selected,
                    }
                })
                .collect();
            backend.sparse_attention(&attn_jobs, path.attn)?
        }
        Some(resident) => {
            let attn_jobs: Vec<PagedAttnJob<'_>> = group
                .iter()
                .zip(&selections)
                .map(|(read, selected)| PagedAttnJob {
                    query: &read.main_query,
                    pages: resident.pages[read.slot],
                    n: batch[read.slot].1.len(),
                    selected,
                })
                .collect();
            backend.sparse_attention_paged(resident.pool, &attn_jobs, path.attn)?
        }
    };
    Ok(outputs)
}

#[cfg(test)]
pub(crate) mod tests;
