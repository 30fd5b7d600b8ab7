#!/usr/bin/env bash
# Part 7 on every GPU of one machine (2 or 4 of them): the topology, NCCL's collectives swept
# from 1 KiB to 1 GiB, the book's ring and one-shot all-reduces against NCCL's, the
# from-scratch parallel layouts (pipeline, tensor, context, expert) checked against one process
# on NCCL, and the pipeline's bubble timed on a model whose stages are compute-bound. NVLink
# multicast (NVLS) is left off, as the chapters assume.
#
#   bash scripts/part7_gpus.sh OUTDIR
#
# Pass KM_COMMIT (and KM_DIRTY) on a copy of the tree without .git. Each step has its own time
# limit; a step that fails or runs out of time is logged and the next one runs. KM_STEPS (names
# separated by spaces, default every step) runs some of them: one device call may not hold them all.
set -uo pipefail
OUT=${1:?usage: part7_gpus.sh OUTDIR}
mkdir -p "$OUT"
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0
N=${KM_GPUS:-$(nvidia-smi -L | grep -c '^GPU')}
RUN="torchrun --standalone --nproc-per-node $N"
nvidia-smi topo -m > "$OUT/topology.txt" 2>&1
echo "commit ${KM_COMMIT:-$(git rev-parse HEAD 2> /dev/null)} dirty ${KM_DIRTY:-?} gpus $N" \
  > "$OUT/provenance.txt"
step() {  # step NAME SECONDS COMMAND...
  local name=$1 limit=$2
  shift 2
  [ -z "${KM_STEPS:-}" ] || [[ " $KM_STEPS " == *" $name "* ]] || return 0
  local t0=$SECONDS
  # a rank still running 5 s before the step's limit prints every thread's stack and exits: a hang
  # leaves its stacks in the log instead of nothing
  KM_HANG_S=$((limit - 5)) timeout "$limit" "$@" > "$OUT/$name.log" 2>&1
  echo "$name: rc $? in $((SECONDS - t0)) s" | tee -a "$OUT/steps.txt"
}
step sweep 200 $RUN -m snippets.part7.sweep --out "$OUT/sweep.json"
# the one-kernel one-shot alone first: a kernel that hangs or is wrong costs this step, not the timings
step fused_smoke 60 $RUN -m snippets.part7.fast_allreduce --smoke-fused --out /dev/null
FUSED=$(grep -q "^fused_smoke: rc 0 " "$OUT/steps.txt" 2>/dev/null && echo --fused)
step fast_allreduce 200 $RUN -m snippets.part7.fast_allreduce --profile $FUSED --out "$OUT/fast_allreduce.json"
# one ring step's traffic alone (send right and receive left, against exchanging with one peer and
# sending one way) at 4 to 256 MiB per message: what the ring's steps cost without the ring
step p2p_patterns 90 $RUN -m snippets.part7.p2p_patterns --out "$OUT/p2p_patterns.json"
# halving-doubling, built from pair exchanges only, against NCCL and the ring, 1 MiB to 1 GiB
step halving 150 $RUN -m snippets.part7.fast_halving --out "$OUT/halving.json"
# Opt-in (only when KM_STEPS names ring_channels or ring_channels_min32): the ring's graph timings alone, once
# with NCCL's log of the point-to-point channels it sets up, once with at least 32 channels per peer; logs and
# JSON stay in OUTDIR, nothing is recorded. On 4 x H200 the log showed as many channels per peer as in all, which
# refuted the channels-per-peer explanation of the slow 4-GPU ring (Part 7's collectives chapter).
if [[ " ${KM_STEPS:-} " == *" ring_channels"* ]]; then
  step ring_channels 150 env NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT,P2P $RUN -m snippets.part7.fast_allreduce \
    --pieces 1 --timing graph --repeats 1 --out "$OUT/ring_channels_default.json"
  step ring_channels_min32 150 env NCCL_MIN_P2P_NCHANNELS=32 $RUN -m snippets.part7.fast_allreduce \
    --pieces 1 --timing graph --repeats 1 --out "$OUT/ring_channels_min32.json"
fi
step pipeline 45 $RUN -m snippets.part7.pipeline --micro-batches 8
# the bubble with stages whose compute dominates: 8 blocks of width 2048 per GPU, micro-batches of
# 4 x 512 tokens in float32: about 1.7 TFLOP per stage and micro-batch forward, three times that
# forward and backward, some 0.1 s at FP32 rates against well under a millisecond for the 16 MiB
# activation sent over NVLink; a step of 8 micro-batches is (m + p - 1) such pairs, 1 to 1.5 s on
# 2 or 4 GPUs, 12 steps over both schedules; each schedule also builds the whole model on every
# rank's CPU (0.8 or 1.6 billion parameters, a few seconds); files pipeline.json
step pipeline_timing 120 $RUN -m snippets.part7.pipeline --micro-batches 8 --steps 6 --dim 2048 \
  --blocks $((8 * N)) --seq-len 512 --micro-batch-size 4 --dtype float32 --no-check \
  --out "$OUT/pipeline.json"
step tensor_parallel 45 $RUN -m snippets.part7.tensor_parallel
step context_parallel 45 $RUN -m snippets.part7.context_parallel
step expert_parallel 45 $RUN -m snippets.part7.expert_parallel
step fsdp 45 $RUN -m snippets.part7.fsdp
step tp_overlap 150 $RUN -m snippets.part7.tp_overlap --out "$OUT/tp_overlap.json"
# a transformer of about 1e9 parameters: one GPU, then data parallelism (the book's and torch's) and
# FSDP2 on all of them, the same batch per GPU (weak scaling); files scaling_<mode>.json
step scaling_single 150 torchrun --standalone --nproc-per-node 1 -m snippets.part7.scaling \
  --mode single --out "$OUT/scaling_single.json"
for mode in ddp_book ddp_torch fsdp2; do
  step "scaling_$mode" 150 $RUN -m snippets.part7.scaling --mode "$mode" --out "$OUT/scaling_$mode.json"
done
