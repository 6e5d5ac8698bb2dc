"""`python -m tests.campaign --seed N --minutes M --topology single|cluster --faults a,b`."""

from __future__ import annotations

import argparse
import asyncio
import sys

from tests.campaign.nemesis import CLUSTER_ONLY, FAULT_KINDS, default_faults
from tests.campaign.runner import Config, campaign
from tests.services import stop_own_services


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.campaign", description=__doc__)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--minutes", type=float, default=1.0)
    parser.add_argument("--topology", choices=("single", "cluster"), default="single")
    parser.add_argument(
        "--faults",
        default=None,
        help=f"comma-separated, of {','.join(FAULT_KINDS)} (empty: none; default: every fault"
        f" of the topology, {','.join(CLUSTER_ONLY)} on the cluster only)",
    )
    args = parser.parse_args(argv)
    given = default_faults(args.topology) if args.faults is None else args.faults.split(",")
    faults = [f for f in given if f]
    unknown = sorted(set(faults) - set(FAULT_KINDS))
    if unknown:
        parser.error(f"unknown faults: {', '.join(unknown)}")
    if args.topology != "cluster" and set(faults) & set(CLUSTER_ONLY):
        parser.error(f"{','.join(CLUSTER_ONLY)} needs --topology cluster")
    config = Config(args.seed, args.minutes, args.topology, faults)
    try:
        result = asyncio.run(campaign(config))
    finally:
        stop_own_services()
    print(result.report())
    return 1 if result.violations else 0


if __name__ == "__main__":
    sys.exit(main())
