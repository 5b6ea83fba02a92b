"""What the per-update agreement costs: one `any_process` all-gather of three flags.

    python bench/agreement_cost.py                       # 2 local processes, 1 device each
    python bench/agreement_cost.py --processes 4 --calls 2000

Every update of a multi-process run calls `attnmt.parallel.agreement.any_process` once
(train/stopping.py). Here N local CPU processes (gloo over 127.0.0.1) make `--calls` calls
after a warm-up, and process 0 reports the mean and median wall time per call. Between
hosts the figure adds the network's round trip; on accelerators the all-gather runs on
the device interconnect.
"""

from __future__ import annotations

import argparse
import os
import socket
import subprocess
import sys

import common

_WORKER = """
import statistics, sys, time
from attnmt.parallel.distributed import initialize
initialize()
import jax
import numpy as np
from attnmt.parallel.agreement import any_process
calls = int(sys.argv[1])
flags = np.array([False, False, jax.process_index() == 1])
for _ in range(20):
    any_process(flags)
times = []
for _ in range(calls):
    start = time.perf_counter()
    any_process(flags)
    times.append(time.perf_counter() - start)
mean, median = (1e6 * f(times) for f in (statistics.mean, statistics.median))
if jax.process_index() == 0:
    print(f"mean_us={mean:.1f} median_us={median:.1f}")
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--processes", type=int, default=2)
    parser.add_argument("--calls", type=int, default=1000)
    args = parser.parse_args()
    info = common.machine_info()
    common.print_machine(info)
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
    env.update(
        JAX_PLATFORMS="cpu",
        ATTNMT_COORDINATOR_ADDRESS=f"127.0.0.1:{port}",
        ATTNMT_NUM_PROCESSES=str(args.processes),
        ATTNMT_LOCAL_DEVICE_COUNT="1",
    )
    workers = [
        subprocess.Popen(
            [sys.executable, "-c", _WORKER, str(args.calls)],
            env={**env, "ATTNMT_PROCESS_ID": str(index)},
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
        )
        for index in range(args.processes)
    ]
    outputs = [worker.communicate(timeout=600)[0] for worker in workers]
    print(f"{args.processes} processes, {args.calls} calls: {outputs[0].strip()}")


if __name__ == "__main__":
    main()
