"""`python -m tests.campaign --seed N --minutes M --topology single|cluster --faults a,b`."""

from __future__ import annotations

import argparse
import asyncio
import sys

from tests.campaign.nemesis import FAULT_KINDS
from tests.campaign.runner import Config, campaign
from tests.services import stop_own_services


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.campaign", description=__doc__)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--minutes", type=float, default=1.0)
    parser.add_argument("--topology", choices=("single", "cluster"), default="single")
    parser.add_argument(
        "--faults",
        default=",".join(FAULT_KINDS),
        help=f"comma-separated, of {','.join(FAULT_KINDS)} (empty: none)",
    )
    args = parser.parse_args(argv)
    faults = [f for f in args.faults.split(",") if f]
    unknown = sorted(set(faults) - set(FAULT_KINDS))
    if unknown:
        parser.error(f"unknown faults: {', '.join(unknown)}")
    config = Config(args.seed, args.minutes, args.topology, faults)
    try:
        result = asyncio.run(campaign(config))
    finally:
        stop_own_services()
    print(result.report())
    return 1 if result.violations else 0


if __name__ == "__main__":
    sys.exit(main())
