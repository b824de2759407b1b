# Shell functions the benchmark scripts share; each script sources this.

# usage SCRIPT: prints the comment block at the top of SCRIPT (after the
# #! line), without its '# ' marks: the script's --help.
usage() {
    awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$1"
}

# disk_info DIR FSTYPE: the device under DIR, its size, whether it is
# rotational and its model, for the results' header.
disk_info() {
    local disk
    disk=$(df --output=source "$1" | tail -1)
    printf '%s (%s), %s' "$disk" "$2" "$(lsblk -dno SIZE,ROTA,MODEL "$disk" 2>/dev/null |
        awk '{printf "size %s, rotational=%s, model %s", $1, $2, ($3 == "" ? "n/a" : $3)}')"
}
