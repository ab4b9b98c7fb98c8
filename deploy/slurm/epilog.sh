#!/bin/bash
# FlopWatch Slurm epilog: remove the ending job from the GPU-to-job mapping directory.
#
# Removes the job's line from every GPU file that holds it (not only the GPUs named in the
# environment, so a changed allocation cannot leave a stale line), deletes files left empty and
# the job's users/<job_id>. The agent drops the job's flopwatch_gpu_job_info series on its next
# collection. Install as `Epilog=` in slurm.conf next to prolog.sh; never fails the job.

MAP_DIR="${FLOPWATCH_GPU_JOB_DIR:-/run/flopwatch/gpu-jobs}"
job="${SLURM_JOB_ID:-}"

log() { echo "flopwatch epilog (job ${job:-?}): $*" >&2; }

[ -n "$job" ] || { log "SLURM_JOB_ID is not set; nothing removed"; exit 0; }
[ -d "$MAP_DIR" ] || exit 0

(
  flock -w 10 9 || { log "lock on $MAP_DIR/.lock timed out"; exit 0; }
  for file in "$MAP_DIR"/[0-9]*; do
    [ -f "$file" ] || continue
    grep -qxF -- "$job" "$file" || continue
    gpu="${file##*/}"
    tmp="$MAP_DIR/.$gpu.$$"
    if grep -vxF -- "$job" "$file" > "$tmp"; then
      chmod 644 "$tmp" && mv -f "$tmp" "$file" || { rm -f "$tmp"; log "cannot rewrite $file"; }
    else
      rm -f "$tmp" "$file"  # no other job on this GPU
    fi
  done
  case "$job" in
    */*|.*) ;;
    *) rm -f "$MAP_DIR/users/$job" ;;
  esac
) 9>"$MAP_DIR/.lock"
exit 0
