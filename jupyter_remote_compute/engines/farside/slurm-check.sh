# slurm-check.sh: one round trip for the Slurm kind's check; each section starts with @@name and ends with
# "@@rc <code>" (slurm_commands.partitions.parse_check reads it; the sinfo format is its SINFO_FORMAT).
for c in sbatch squeue scancel sinfo scontrol; do command -v "$c" >/dev/null 2>&1 || echo "@@missing $c"; done
echo @@version; sinfo --version 2>&1; echo "@@rc $?"
echo @@partitions; sinfo --noheader --format='%P|%a|%l|%D|%T|%c|%m|%G|%N' 2>&1; echo "@@rc $?"
echo @@user; id -un; echo "@@rc $?"
echo @@account
timeout 20 sacctmgr --noheader --parsable2 show user "$(id -un)" format=DefaultAccount 2>&1; echo "@@rc $?"
