"""Reads a dtensor checkpoint and an exported safetensors file with Python's own tools only
(json, numpy, the safetensors package, xxhash when present), as another program would:
  - every data file of the checkpoint opens with safetensors, and every chunk's bytes match
    the XXH64 checksums of the manifest (block by block);
  - the chunks of each tensor entry, placed at their boxes, cover it exactly once;
  - each parameter assembled from the checkpoint ("model.<name>") equals the same name in the
    exported file, bit for bit.
Usage: check_files.py CHECKPOINT_DIR EXPORTED.safetensors
Exit status 77 (a CTest skip) when numpy or safetensors is not installed."""
import json
import os
import sys

try:
    import numpy as np
    from safetensors import safe_open
except ImportError as e:
    print(f"SKIP: {e} (pip install numpy safetensors to run this check)")
    sys.exit(77)
try:
    import xxhash
except ImportError:
    xxhash = None

checkpoint, exported = sys.argv[1], sys.argv[2]
manifest = json.load(open(os.path.join(checkpoint, "manifest.json")))
assert manifest["format"] == "dtensor-checkpoint" and manifest["version"] == 1, manifest["format"]
block = manifest["block_bytes"]
files = manifest["files"]
np_dtype = {"f32": np.float32, "f64": np.float64, "f16": np.float16, "i64": np.int64, "i32": np.int32, "bool": np.bool_}
handles = {f["name"]: safe_open(os.path.join(checkpoint, f["name"]), "np") for f in files}
for f in files:
    assert os.path.getsize(os.path.join(checkpoint, f["name"])) == f["bytes"], f["name"]

assembled, checked_blocks = {}, 0
for name, entry in manifest["entries"].items():
    if entry["kind"] not in ("dist_tensor", "tensor"):
        continue
    full = np.zeros(entry["shape"], dtype=np_dtype[entry["dtype"]])
    covered = np.zeros(entry["shape"], dtype=np.int32)
    for chunk in entry["chunks"]:
        file = files[chunk["file"]]["name"]
        piece = handles[file].get_tensor(name)
        assert list(piece.shape) == chunk["sizes"], (name, piece.shape, chunk["sizes"])
        box = tuple(slice(o, o + s) for o, s in zip(chunk["offsets"], chunk["sizes"]))
        full[box] = piece
        covered[box] += 1
        if xxhash:
            with open(os.path.join(checkpoint, file), "rb") as fh:
                fh.seek(chunk["begin"])
                data = fh.read(piece.nbytes)
            for k, expected in enumerate(chunk["checksums"]):
                assert xxhash.xxh64(data[k * block:(k + 1) * block]).hexdigest() == expected, (name, k)
                checked_blocks += 1
    assert (covered == 1).all(), f"{name}: chunks do not cover it exactly once"
    assembled[name] = full

with safe_open(exported, "np") as f:
    names = list(f.keys())
    for name in names:
        mine = assembled["model." + name]
        theirs = f.get_tensor(name)
        assert mine.dtype == theirs.dtype and mine.shape == theirs.shape, name
        assert mine.tobytes() == theirs.tobytes(), f"{name}: the export differs from the checkpoint"
print(f"PASS: {len(files)} data files, {len(assembled)} tensors assembled, {len(names)} exported tensors equal, "
      f"{checked_blocks} XXH64 blocks verified" + ("" if xxhash else " (xxhash not installed: checksums skipped)"))
