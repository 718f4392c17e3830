"""The capture recipes ``calib capture recipe`` prints (also in docs/capture.md)."""

from __future__ import annotations

PYTORCH = """\
# Capture a calibration-ready trace of your own PyTorch loop (DDP, FSDP, FSDP2, plain).
# Every rank runs this; each writes rank<R>.pt.trace.json.gz, rank 0 writes run_config.json.
from calib.capture import capture, CaptureSettings

with capture(
    "traces/gpt1b-fsdp-64gpu",             # one directory per run
    system="polaris",                      # the system tag calib stores the run under
    model=dict(d=2048, l=24, a=16, s=2048, V=50304, b=4),   # hidden, layers, heads, seq, vocab, micro-batch
    framework="fsdp", zero_stage=3,        # ddp=0, FSDP SHARD_GRAD_OP=2, FULL_SHARD=3
    parallel=dict(dp=64, tp=1, pp=1),
    settings=CaptureSettings(wait=5, warmup=2, active=3),   # skip 5 steps, record 3 (defaults 1/1/3)
) as cap:
    for batch in loader:
        loss = model(batch)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        cap.step()                         # once per optimizer step, after optimizer.step()
        if cap.done:                       # optional: stop once the window is written
            break

# then:  calib capture check traces/gpt1b-fsdp-64gpu
#        calib ingest traces/gpt1b-fsdp-64gpu --system polaris
"""

TORCH_ONLY = """\
# Without calib on the cluster: the same settings with torch.profiler alone.
import torch, torch.distributed as dist
from torch.profiler import ProfilerActivity, profile, schedule

rank = dist.get_rank()
prof = profile(
    activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA],
    schedule=schedule(wait=5, warmup=2, active=3, repeat=1),   # ProfilerStep#N windows
    record_shapes=True,                     # GEMM FLOPs and gloo message sizes
    with_stack=False, profile_memory=False, # overhead calib does not need
    on_trace_ready=lambda p: p.export_chrome_trace(f"traces/run1/rank{rank}.pt.trace.json.gz"),
)
prof.start()
for step, batch in enumerate(loader):
    train_step(batch)
    prof.step()
    if step == 5 + 2 + 3:
        break
prof.stop()

# then add the system tag and model shape (writes run_config.json):
#   calib capture collect traces/run1 --out traces/run1-calib --system polaris \\
#         --model d=2048,l=24,a=16,s=2048,V=50304,b=4 --framework ddp --zero-stage 0
"""

DEEPSPEED = """\
# DeepSpeed: wrap the engine's loop; call cap.step() after engine.step().
import deepspeed
from calib.capture import capture

engine, _, _, _ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=ds_config)
stage = ds_config["zero_optimization"]["stage"]
gas = engine.gradient_accumulation_steps()
with capture("traces/gpt1b-z%d" % stage, system="polaris", framework="deepspeed", zero_stage=stage,
             model=dict(d=2048, l=24, a=16, s=2048, V=50304, b=engine.train_micro_batch_size_per_gpu())) as cap:
    for i, batch in enumerate(loader):
        loss = engine(batch)
        engine.backward(loss)
        engine.step()
        if (i + 1) % gas == 0:             # one ProfilerStep per optimizer step, not per micro-batch
            cap.step()
        if cap.done:
            break

# Notes
# * State the ZeRO stage (zero_stage=...): ZeRO-1 and ZeRO-2 leave near-identical traces.
# * Turn off "wall_clock_breakdown" and the flops profiler while capturing: both add
#   synchronisations that are not in a normal step.
# * CPU trials: DS_ACCELERATOR=cpu and a gloo process group work (deepspeed 0.19.8 tested,
#   ZeRO-1/2/3); fixtures/generate.py shows a complete example.
"""

MEGATRON = """\
# Megatron-LM has a torch.profiler switch built in; it records shapes already.
torchrun ... pretrain_gpt.py ... \\
    --profile --use-pytorch-profiler \\
    --profile-step-start 10 --profile-step-end 13 \\
    --profile-ranks $(seq -s ' ' 0 $((WORLD_SIZE - 1))) \\
    --tensorboard-dir traces/gpt-13b-tp4-pp2

# Megatron names the files <host>_<pid>.<ns>.pt.trace.json; gather them, add the system
# tag, model shape and layout, and check the result:
calib capture collect traces/gpt-13b-tp4-pp2 --out traces/gpt-13b-calib --system polaris \\
    --model d=5120,l=40,a=40,s=2048,V=51200,b=1 --framework megatron --tp 4 --pp 2

# Notes
# * --profile-ranks defaults to rank 0 only: list every rank of at least one TP x PP slice
#   (all ranks is best) so that TP, PP and DP collectives are all seen.
# * --profile-step-start must leave a few warm steps (>= 2) after start-up.
# * Megatron's profiler also sets with_stack=True: larger traces, same timings for calib.
# * Megatron names its process groups; calib reads the TP/PP/DP roles from their
#   descriptions and message sizes from the NCCL kernels' record_param_comms args.
"""

RECIPES = {"pytorch": PYTORCH, "torch-only": TORCH_ONLY, "deepspeed": DEEPSPEED, "megatron": MEGATRON}
