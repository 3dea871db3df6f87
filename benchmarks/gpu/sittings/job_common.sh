# Sourced by the sitting scripts (not run): the job's deadline and the pieces their
# lane commands share. Sets, from the environment:
#   BENCH_COMMIT (required, exported), JOB_S (default 1600 s: a job started after
#   calls 1-4, which hold the machine ~85 s, ends before the lease's 1800),
#   UNTIL (exported: the job's deadline, epoch s; kernel_work.sh keeps to it),
#   root (STATE_ROOT, default /tmp: lane <i> keeps its state in $root/bs-lane<i>),
#   pair (run_serving's backends: FLASH_ATTN and the fork), and left (a budget,
#   expanded in the lane when its step starts: what is left of the job, less 20 s).
: "${BENCH_COMMIT:?}"
export BENCH_COMMIT
cd "$(dirname "${BASH_SOURCE[0]}")/../../.." || exit 1
job_s=${JOB_S:-1600}
root=${STATE_ROOT:-/tmp}
export UNTIL=$(($(date +%s) + job_s - 20))
pair="--backends FLASH_ATTN,TRITON_ATTN-fork --startup-timeout-s 600"
# shellcheck disable=SC2016  # expanded by the lane's shell, at the step's start
left='$((UNTIL - $(date +%s) - 20))'
