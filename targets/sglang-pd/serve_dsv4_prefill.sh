#!/bin/sh
# Launch config of the sglang-pd target's prefill role (target.toml: systemd;
# target-compose.toml: docker compose runs this same file as the container's entrypoint).
# bisect edits the flag lines below in place (docs/design.md 3.3): each `export` line is
# one env flag of the built-in catalog (flags/*.toml), and the launch command's
# --enable-hierarchical-cache is the HICACHE switch. Flags listed for decode only
# (SGLANG_SM120_MMA_FLASHMLA, --cuda-graph-max-bs) must not appear here: bisect refuses a
# flag set in a role it does not list (it would be half-applied).
#
# Adapt: the model path, --tp-size, the ports (keep them in step with target.toml's
# health/metrics URLs and the router's --prefill URL), the transfer backend, and your
# tool-call/reasoning parser options. Keep every catalog flag written out explicitly,
# even at its default: `bisect check` then shows each edit as a replaced line, and a
# misspelt name shows up as a flag matching no line.
export SGLANG_DSV4_BF16_INDEX_K=1
export SGLANG_DSV4_INDEX_K_HICACHE_SYNC=0
export SGLANG_OPT_USE_TOPK_V2=1
# --tool-call-parser: SGLang returns tool calls as OpenAI `tool_calls` only when a parser
# is set (serving_chat.py); without one every DSML call comes back as text, every session
# of both arms is `leak`, and no flag can be implicated (`bisect check` and `bisect run`
# ask the engine and refuse). DeepSeek V4 writes `<｜DSML｜tool_calls>`: `deepseekv4`;
# for V3.2 (`<｜DSML｜function_calls>`) use `deepseekv32`, for V3.1 `deepseekv31`.
exec python3 -m sglang.launch_server \
    --model-path /models/DeepSeek-V4-Flash \
    --served-model-name deepseek-v4-flash \
    --trust-remote-code \
    --tp-size 4 \
    --disaggregation-mode prefill \
    --disaggregation-transfer-backend nixl \
    --disaggregation-bootstrap-port 8998 \
    --host 127.0.0.1 --port 30000 \
    --tool-call-parser deepseekv4 \
    --enable-metrics \
    --enable-hierarchical-cache
