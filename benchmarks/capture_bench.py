"""Speed of the capture side, each against a named peer on the same machine.

1. ``check_run`` (msgspec scan, ISA-L inflate) against the stdlib peer
   ``json.load(gzip.open(...))`` on HTA's df_index_resolver trace (54 MB of JSON);
   the peer only parses, calib also classifies every event.
2. Starting a 2-rank gloo group with ``spawn_local`` (fork server with torch preloaded)
   against ``torch.multiprocessing`` spawn (each rank imports torch), median of N.
3. Profiler overhead of the capture settings: median step time inside the recorded
   window against the same steps unprofiled (tiny GPT d=128 on one CPU thread).

Run: ``python benchmarks/capture_bench.py [--repeat 3]``.  Timings depend on the load of
the machine; the ratios are what to compare.
"""

from __future__ import annotations

import argparse
import gzip
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
TRACE_DIR = ROOT / "fixtures" / "traces" / "hta" / "df_index_resolver"


def _median_time(fn, repeat: int) -> float:  # noqa: ANN001
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def bench_check(repeat: int) -> None:
    from calib.ingest.capture.check import check_run

    trace = next(TRACE_DIR.glob("*.json.gz"))
    t_calib = _median_time(lambda: check_run(TRACE_DIR), repeat)

    def peer() -> None:
        with gzip.open(trace) as fh:
            json.load(fh)

    t_json = _median_time(peer, repeat)
    mb = len(gzip.decompress(trace.read_bytes())) / 1e6
    print(f"check_run            {t_calib:7.3f} s  ({mb / t_calib:6.1f} MB/s of JSON)")
    print(
        f"json.load(gzip.open) {t_json:7.3f} s  ({mb / t_json:6.1f} MB/s)   ratio peer/calib = {t_json / t_calib:.2f}x"
    )


def _noop_rank(rank: int, world_size: int, init_file: str) -> None:
    from calib.ingest.capture.launch import init_local_rank

    init_local_rank(rank, world_size, init_file, threads=1)
    import torch.distributed as dist

    dist.barrier()
    dist.destroy_process_group()


def bench_start(repeat: int) -> None:
    from calib.ingest.capture.launch import spawn_local

    spawn_local(_noop_rank, 2)  # start the fork server once, as a generator run does
    t_fs = _median_time(lambda: spawn_local(_noop_rank, 2), repeat)
    t_sp = _median_time(lambda: spawn_local(_noop_rank, 2, start_method="spawn"), repeat)
    print(
        f"2-rank gloo start, fork server {t_fs:6.2f} s; spawn {t_sp:6.2f} s   ratio spawn/forkserver = {t_sp / t_fs:.1f}x"
    )


def bench_overhead(steps: int) -> None:
    import torch
    from calib.ingest.capture.model import TinyGPT, batch
    from calib.ingest.capture.profile import CaptureSettings, capture
    from calib.ingest.capture.runspec import GPTShape

    torch.set_num_threads(1)
    shape = GPTShape(d=128, l=2, a=4, s=64, V=1024, b=4)
    model = TinyGPT(shape)
    opt = torch.optim.AdamW(model.parameters())
    x, y = batch(shape, 0)
    settings = CaptureSettings(wait=2, warmup=1, active=steps)
    with tempfile.TemporaryDirectory() as tmp, capture(tmp, settings=settings) as cap:
        for _ in range(settings.window_steps + steps):
            model(x, y).backward()
            opt.step()
            opt.zero_grad()
            cap.step()
    first = settings.wait + settings.warmup
    active = statistics.median(cap.step_times_s[first : first + steps])
    after = statistics.median(cap.step_times_s[first + steps :])
    print(
        f"step d=128: profiled {active * 1e3:6.1f} ms, unprofiled {after * 1e3:6.1f} ms   "
        f"ratio profiled/unprofiled = {active / after:.2f}x"
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    bench_check(args.repeat)
    bench_start(args.repeat)
    bench_overhead(steps=5)


if __name__ == "__main__":
    main()
