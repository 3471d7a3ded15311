#!/bin/sh
# Launch config of the sglang-pd target's decode role (target.toml: systemd;
# target-compose.toml: docker compose runs this same file as the container's entrypoint).
# bisect edits the flag lines below in place: SGLANG_DSV4_BF16_INDEX_K and
# SGLANG_OPT_USE_TOPK_V2 are flipped here and in the prefill script together (their
# catalog roles are prefill and decode); SGLANG_SM120_MMA_FLASHMLA and
# --cuda-graph-max-bs are decode's alone. Prefill-only flags (--enable-hierarchical-cache,
# SGLANG_DSV4_INDEX_K_HICACHE_SYNC) must not appear here.
#
# Adapt: as in serve_dsv4_prefill.sh (model path, --tp-size, ports, transfer backend).
export SGLANG_DSV4_BF16_INDEX_K=1
export SGLANG_SM120_MMA_FLASHMLA=1
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
    --base-gpu-id 4 \
    --disaggregation-mode decode \
    --disaggregation-transfer-backend nixl \
    --host 127.0.0.1 --port 30002 \
    --tool-call-parser deepseekv4 \
    --enable-metrics \
    --cuda-graph-max-bs 32
