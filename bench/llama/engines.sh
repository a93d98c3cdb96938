# bench/llm --engine llama: three llama.cpp servers (llama-server, built by
# bench/llama/build, a random-weight model with Llama 3's tokenizer) in
# place of the simulated engines. Sourced by bench/llm, which provides
# start, wait_http, median, fmt, ENGINE_PORTS, PIN_LOAD, TRACE and work.
#
# Each engine: one thread, LLAMA_SLOTS slots sharing a KV cache of
# LLAMA_CTX tokens, and a prompt cache across slots of LLAMA_CACHE_MIB MiB
# (about 4 KiB a token for this model): what a conversation's next turn
# finds again when its prefix left the slots. The engines share one core;
# the routers run on the other.
LLAMA_SLOTS=${LLAMA_SLOTS:-4}
LLAMA_CTX=${LLAMA_CTX:-16384}
LLAMA_CACHE_MIB=${LLAMA_CACHE_MIB:-32}
# llama-chat: the multi-turn chat scenario at a rate one core of engines
# serves about half busy; llama-chat-rR-cM: the same at R conversations a
# second, each engine with a prompt cache of M MiB (a cell of the grid);
# llama-trace: 120 s of the Mooncake trace from minute 20, 2x faster,
# lengths divided by 64.
LLAMA_CHAT=(--conversations 80 --rate 1 --turns 4 --think-ms 500 --max-seconds 150
    --system-prompts 8 --system-tokens 500 --user-tokens 100 --max-tokens 16 --connections 64
    --timeout 60s)
LLAMA_TRACE=(--trace "$TRACE" --trace-from 1200 --trace-seconds 240 --speedup 2 --token-scale 64
    --connections 1024 --timeout 60s --max-seconds 180)

llama_setup() {
    local built
    mapfile -t built < <(bench/llama/build)
    LLAMA_SERVER=${built[0]} LLAMA_MODEL=${built[1]}
    LLAMA_VERSION=$(cat "$(dirname "$LLAMA_SERVER")/../../VERSION")
}

# A chat cell's rate ($2 of 1) or prompt cache ($2 of 2), from its name $1.
llama_cell() { sed -E "s/^llama-chat-r([0-9.]+)-c([0-9]+)$/\\$2/" <<<"$1"; }

# The prompt cache of scenario $1's engines, in MiB.
llama_cache_mib() {
    case $1 in
        llama-chat-r*-c*) llama_cell "$1" 2 ;;
        *) echo "$LLAMA_CACHE_MIB" ;;
    esac
}

llama_start_engines() {
    local i cache
    cache=$(llama_cache_mib "$1")
    for i in 1 2 3; do
        start "$PIN_LOAD" "$LLAMA_SERVER" -m "$LLAMA_MODEL" --host 127.0.0.1 \
            --port "${ENGINE_PORTS[$((i - 1))]}" -t 1 -np "$LLAMA_SLOTS" -c "$LLAMA_CTX" \
            --cache-ram "$cache" --metrics --chat-template chatml --no-webui \
            --log-disable >>"$work/engines.err" 2>&1
    done
    for i in 0 1 2; do wait_http "http://127.0.0.1:${ENGINE_PORTS[$i]}/health"; done
}

# The load of a llama scenario.
llama_load() {
    case $1 in
        llama-chat) echo "${LLAMA_CHAT[*]}" ;;
        llama-chat-r*-c*) echo "${LLAMA_CHAT[*]}" | sed -E "s/--rate [0-9.]+/--rate $(llama_cell "$1" 1)/" ;;
        llama-trace) echo "${LLAMA_TRACE[*]}" ;;
    esac
}

# Adds the engines' own counters to run result $1: prompt tokens each
# computed (llamacpp:prompt_tokens_total) and took from its cache
# (llamacpp:prompt_tokens_cached_total), summed and per engine.
llama_counters() {
    local json=$1 i text computed cached per=()
    local total_computed=0 total_cached=0
    for i in 0 1 2; do
        text=$(curl -fs -m 2 "http://127.0.0.1:${ENGINE_PORTS[$i]}/metrics" || true)
        computed=$(awk '$1 == "llamacpp:prompt_tokens_total" { printf "%d", $2 }' <<<"$text")
        cached=$(awk '$1 == "llamacpp:prompt_tokens_cached_total" { printf "%d", $2 }' <<<"$text")
        per+=("${computed:-0}")
        total_computed=$((total_computed + ${computed:-0}))
        total_cached=$((total_cached + ${cached:-0}))
    done
    jq --argjson c "$total_computed" --argjson h "$total_cached" \
        --argjson per "[$(IFS=,; echo "${per[*]}")]" '
        .engine = {computed: $c, cached: $h,
            hit_ratio: (if $c + $h > 0 then $h / ($c + $h) else null end),
            busiest: (if $c > 0 then ($per | max) / ($c / ($per | length)) else null end)}
    ' "$json" >"$json.tmp" && mv "$json.tmp" "$json"
}

# The table of llama scenario $1 over targets $2...: what the engines
# computed (their counters), against the least of any target.
llama_table() {
    local scenario=$1 target best=
    shift
    for target in "$@"; do
        local c
        c=$(median "$scenario" "$target" engine.computed)
        [[ $c == null ]] && continue
        if [[ -z $best ]] || awk -v a="$c" -v b="$best" 'BEGIN { exit !(a < b) }'; then best=$c; fi
    done
    echo "| target | prompt tokens computed | ÷ least | engines' hit ratio | TTFT p50 / p99 (ms) | busiest ÷ mean | errors |"
    echo "|---|---|---|---|---|---|---|"
    for target in "$@"; do
        m() { median "$scenario" "$target" "$1"; }
        local c row
        c=$(m engine.computed)
        row="| $target | $(fmt "$c" %.0f) | $(fmt "$(awk -v c="$c" -v b="${best:-0}" 'BEGIN { if (c == "null" || b == 0) print ""; else print c / b }')" %.2f)"
        row+=" | $(fmt "$(m engine.hit_ratio)" %.3f)"
        row+=" | $(fmt "$(m ttft_p50_ms)" %.0f) / $(fmt "$(m ttft_p99_ms)" %.0f)"
        row+=" | $(fmt "$(m engine.busiest)" %.2f)"
        local errors cut
        errors=$(fmt "$(m errors)" %.0f); cut=$(fmt "$(m cut_conversations)" %.0f)
        [[ $cut != 0 && $cut != – ]] && errors+=" (+$cut cut)"
        echo "$row | $errors |"
    done
}
