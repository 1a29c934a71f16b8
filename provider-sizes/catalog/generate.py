#!/usr/bin/env python3
"""Writes the shipped size catalogs (catalog/shipped/*.sizes) from the flavour CSVs.

Usage (from the repository root):

    python3 provider-sizes/catalog/generate.py [--sources ../shared/catalog-sources] [--date YYYY-MM-DD]

Inputs: every CSV named in PROVIDERS below, from --sources, or from catalog/sources/ in this crate
for the files we collected ourselves (alibaba.csv). Every CSV has the header
`name,vcpus,memory_mib,gpus,gpu_model,local_disk_gib`.

Output format (one file per provider, read by src/catalog.rs at first use):

    # comment lines: provider, source file, its sha256, generation date
    <flavour> <TAB> <vcpus> <TAB> <memory MiB> <TAB> <gpus> <TAB> <local disk GiB or '-' when unknown>

Only integers are written; the Rust side turns them into exact quantities (MiB stay MiB).
"""

import argparse
import csv
import datetime
import hashlib
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))

# provider key used by the crate -> (csv file name, where it comes from)
PROVIDERS = {
    "aws": ("aws.csv", "shared"),
    "azure": ("azure.csv", "shared"),
    "gce": ("gcp.csv", "shared"),
    "hetzner": ("hetzner.csv", "shared"),
    "digitalocean": ("digitalocean.csv", "shared"),
    "linode": ("linode.csv", "shared"),
    "vultr": ("vultr.csv", "shared"),
    "scaleway": ("scaleway.csv", "shared"),
    "equinixmetal": ("equinix-metal.csv", "shared"),
    "alibaba": ("alibaba.csv", "local"),
}

HEADER = ["name", "vcpus", "memory_mib", "gpus", "gpu_model", "local_disk_gib"]


def nonneg_int(text, what, where):
    try:
        value = int(text)
    except ValueError:
        sys.exit(f"{where}: {what} {text!r} is not an integer")
    if value < 0:
        sys.exit(f"{where}: {what} {text!r} is negative")
    return value


def convert(provider, path, date):
    with open(path, "rb") as f:
        digest = hashlib.sha256(f.read()).hexdigest()
    lines = [
        f"# kkp-quota shipped size catalog for provider {provider}",
        f"# source: {os.path.basename(path)} (upstream sources and caveats: its README.md)",
        f"# source sha256: {digest}",
        f"# generated: {date} by provider-sizes/catalog/generate.py",
        "# columns: flavour, vcpus, memory MiB, whole gpus, local disk GiB ('-' = unknown)",
    ]
    seen = set()
    with open(path, newline="") as f:
        reader = csv.reader(f)
        header = next(reader)
        if header != HEADER:
            sys.exit(f"{path}: unexpected header {header}")
        for number, row in enumerate(reader, start=2):
            where = f"{path}:{number}"
            if len(row) != len(HEADER):
                sys.exit(f"{where}: expected {len(HEADER)} columns")
            name, vcpus, memory, gpus, _model, disk = row
            if not name or any(c.isspace() for c in name):
                sys.exit(f"{where}: bad flavour name {name!r}")
            if name in seen:
                sys.exit(f"{where}: duplicate flavour {name}")
            seen.add(name)
            fields = [
                name,
                str(nonneg_int(vcpus, "vcpus", where)),
                str(nonneg_int(memory, "memory_mib", where)),
                str(nonneg_int(gpus, "gpus", where)),
                "-" if disk == "" else str(nonneg_int(disk, "local_disk_gib", where)),
            ]
            lines.append("\t".join(fields))
    return "\n".join(lines) + "\n", len(seen)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument(
        "--sources",
        default=os.path.join(HERE, "..", "..", "..", "shared", "catalog-sources"),
        help="directory with the shared catalog CSVs",
    )
    parser.add_argument("--date", default=datetime.date.today().isoformat())
    parser.add_argument("--out", default=os.path.join(HERE, "shipped"))
    parser.add_argument(
        "--check",
        action="store_true",
        help="write nothing; fail when a shipped file's data differs from what the sources give",
    )
    args = parser.parse_args()
    os.makedirs(args.out, exist_ok=True)
    stale = []
    for provider, (file_name, origin) in PROVIDERS.items():
        directory = args.sources if origin == "shared" else os.path.join(HERE, "sources")
        text, count = convert(provider, os.path.join(directory, file_name), args.date)
        target = os.path.join(args.out, f"{provider}.sizes")
        if args.check:
            # Compare everything but the generation date.
            def data(t):
                return [line for line in t.splitlines() if not line.startswith("# generated:")]

            with open(target) as f:
                if data(f.read()) != data(text):
                    stale.append(target)
            continue
        with open(target, "w") as f:
            f.write(text)
        print(f"{target}: {count} flavours")
    if stale:
        sys.exit("out of date, run provider-sizes/catalog/generate.py: " + ", ".join(stale))


if __name__ == "__main__":
    main()
