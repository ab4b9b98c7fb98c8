#!/bin/bash
# FlopWatch Slurm prolog: record which job holds which GPU, for flopwatch_gpu_job_info.
#
# Writes one file per GPU index in the mapping directory, one job ID per line: the format of
# dcgm-exporter's --hpc-job-mapping-dir, so one directory feeds both exporters. Also writes
# users/<job_id> with the job's user (dcgm-exporter skips directories). Several jobs on one GPU
# (shards, oversubscription) leave several lines.
#
# Install: slurm.conf `Prolog=/etc/slurm/prolog.d/*` (or `Prolog=/path/to/prolog.sh`) on every GPU
# node, and `PrologFlags=Alloc` so it runs at allocation rather than at the first step. The agent
# reads the same directory (attribution.mapping_dir, default /run/flopwatch/gpu-jobs).
#
# A failing prolog drains the node, so this script never fails the job: problems go to the slurmd
# log and it exits 0.

MAP_DIR="${FLOPWATCH_GPU_JOB_DIR:-/run/flopwatch/gpu-jobs}"
job="${SLURM_JOB_ID:-}"
user="${SLURM_JOB_USER:-}"
# Slurm sets SLURM_JOB_GPUS in the prolog; CUDA_VISIBLE_DEVICES/GPU_DEVICE_ORDINAL on older setups.
gpus="${SLURM_JOB_GPUS:-${CUDA_VISIBLE_DEVICES:-${GPU_DEVICE_ORDINAL:-}}}"

log() { echo "flopwatch prolog (job ${job:-?}): $*" >&2; }

[ -n "$job" ] || { log "SLURM_JOB_ID is not set; nothing recorded"; exit 0; }
[ -n "$gpus" ] || exit 0  # a job without GPUs

mkdir -p "$MAP_DIR/users" 2>/dev/null && chmod 755 "$MAP_DIR" "$MAP_DIR/users" 2>/dev/null \
  || { log "cannot create $MAP_DIR"; exit 0; }

(
  flock -w 10 9 || { log "lock on $MAP_DIR/.lock timed out"; exit 0; }
  for gpu in ${gpus//,/ }; do
    case "$gpu" in
      ''|*[!0-9]*) log "skipping GPU '$gpu' (not an index; MIG/UUID devices are not mapped)"; continue ;;
    esac
    file="$MAP_DIR/$gpu"
    tmp="$MAP_DIR/.$gpu.$$"
    {
      [ -f "$file" ] && grep -vxF -- "$job" "$file"
      echo "$job"
    } > "$tmp" && chmod 644 "$tmp" && mv -f "$tmp" "$file" || { rm -f "$tmp"; log "cannot write $file"; }
  done
  if [ -n "$user" ]; then
    tmp="$MAP_DIR/users/.$job.$$"
    printf '%s\n' "$user" > "$tmp" && chmod 644 "$tmp" && mv -f "$tmp" "$MAP_DIR/users/$job" \
      || { rm -f "$tmp"; log "cannot write $MAP_DIR/users/$job"; }
  fi
) 9>"$MAP_DIR/.lock"
exit 0
