#!/usr/bin/env bash
# The exactness gates of scripts/gpu-check.sh that fit a short lease (about a minute on the GPU host, after
# scripts/gather-libs with the fixtures as carry/fixtures.tar.xz): greedy ids of the same command twice and
# under eager vs dmda, tiny Qwen3 Q8_0 (every expert cached, and on the CPU pool) and tiny gpt-oss Q8_0; the
# prompt path's defaults run to run bitwise over 300 tokens. One PASS/FAIL line each.
scripts/carry-unpack # each call brings carry/ packed
export LD_LIBRARY_PATH=$PWD/carry/lib STARPU_SILENT=1 STARPU_HOME=/tmp/sh; S=carry/strata; M=carry/fixtures/models; A=carry/fixtures/archs; o=/tmp
printf 'The quick brown fox jumps over the lazy dog.\nMixture-of-experts models route every token.\n' > $o/calib.txt
$S profile -m $M/tiny-qwen3moe-q8_0.gguf -f $o/calib.txt -o $o/t.profile >/dev/null 2>&1
gen() { $S generate -m $1 -p "Explain why the sky is blue." -n 32 --temp 0 --ignore-eos --print-ids --expert-profile $2 "${@:3}" 2>/dev/null; }
a=$(STARPU_SCHED=eager gen $M/tiny-qwen3moe-q8_0.gguf $o/t.profile --expert-cache 64); b=$(STARPU_SCHED=eager gen $M/tiny-qwen3moe-q8_0.gguf $o/t.profile --expert-cache 64); c=$(STARPU_SCHED=dmda gen $M/tiny-qwen3moe-q8_0.gguf $o/t.profile --expert-cache 64 --adapt-swaps 0)
[ -n "$a" ] && [ "$a" = "$b" ] && [ "$a" = "$c" ] && echo "qwen3 tiny q8_0 all cached: twice + eager vs dmda: PASS" || echo "FAIL $a / $b / $c"
p=$(STARPU_SCHED=eager gen $M/tiny-qwen3moe-q8_0.gguf $o/t.profile --expert-cache 0); q=$(STARPU_SCHED=dmda gen $M/tiny-qwen3moe-q8_0.gguf $o/t.profile --expert-cache 0)
[ -n "$p" ] && [ "$p" = "$q" ] && echo "qwen3 tiny q8_0 CPU pool: eager vs dmda: PASS" || echo "FAIL $p / $q"
af=tiny-gpt-oss-q8_0; $S profile -m $A/$af.gguf -f $o/calib.txt -o $o/g.profile >/dev/null 2>&1
a=$(STARPU_SCHED=eager gen $A/$af.gguf $o/g.profile --expert-cache auto); c=$(STARPU_SCHED=dmda gen $A/$af.gguf $o/g.profile --expert-cache auto --adapt-swaps 0); p=$(STARPU_SCHED=eager gen $A/$af.gguf $o/g.profile --expert-cache 0); q=$(STARPU_SCHED=dmda gen $A/$af.gguf $o/g.profile --expert-cache 0)
[ -n "$a" ] && [ "$a" = "$c" ] && [ -n "$p" ] && [ "$p" = "$q" ] && echo "gpt-oss tiny q8_0 cached and CPU pool: eager vs dmda: PASS" || echo "FAIL gpt-oss $a / $c / $p / $q"
ids=$(seq -s, 100 399); ev() { STARPU_SCHED=eager $S eval -m $M/tiny-qwen3moe-q8_0.gguf -c 512 --prompt-ids $ids --all-logits --expert-profile $o/t.profile --expert-cache 64 --logits-out $1 2>/dev/null; }
ev $o/l1.f32; ev $o/l2.f32; [ -s $o/l1.f32 ] && cmp -s $o/l1.f32 $o/l2.f32 && echo "prompt path defaults run to run bitwise: PASS" || echo "FAIL prompt bits"
