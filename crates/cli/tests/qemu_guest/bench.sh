# Sourced by the kernel nbd guest's /init (kernel_nbd.sh) for
# trireme.scenario=bench (bench/guest.sh, part 5): the guest stands in for
# a Proxmox VE host whose kernel has the nbd module. A single-node trireme
# runs on the guest's first disk; the Proxmox plugin (its own Perl, through
# t/bin/pve-volume) allocates and activates one volume, which makes its
# /dev/nbdN; fio (from the second disk, /dev/vdb, read-only) then runs
# each job on that volume through both of the plugin's paths: the kernel
# device (libaio, direct=1) and the node's NBD socket (fio's nbd engine:
# libnbd, a user-space NBD client, as QEMU's is). Each job's JSON is
# printed between "FIO-BEGIN PATH-JOB" and "FIO-END PATH-JOB rc=N".
export PATH=/usr/bin:$PATH
runtime=$(sed -n 's/.*trireme\.runtime=\([0-9]*\).*/\1/p' /proc/cmdline)
size=$(sed -n 's/.*trireme\.size=\([0-9]*[KMG]\).*/\1/p' /proc/cmdline)
[ -n "$runtime" ] && [ -n "$size" ] || fail "trireme.runtime= and trireme.size= are needed"
case "$size" in
    *K) size_kib=${size%K} ;;
    *M) size_kib=$((${size%M} * 1024)) ;;
    *G) size_kib=$((${size%G} * 1024 * 1024)) ;;
esac
mkdir -p /tools
mount -t ext4 -o ro /dev/vdb /tools || fail "no tools disk on /dev/vdb"
start_node
token=$(cat /data/trireme/admin.token) || fail "no admin token"
pve() {
    (cd /proxmox && TRIREME_PVE_STATE_DIR=/tmp/pve perl -I . -I t/lib t/bin/pve-volume \
        --api "http://$api" --token "$token" --local-api "http://$api" "$@")
}
volume=$(pve alloc 601 vm-601-disk-0 "$size_kib") || fail "alloc_image"
pve activate "$volume" || fail "activate_volume"
device=$(pve path "$volume") || fail "path"
[ -b "$device" ] || fail "the plugin's path $device is no block device: no kernel nbd here?"
say "DEVICE $device -> $(readlink "$device")"
socket=/data/nbd.sock
fio() {
    /tools/lib/ld-linux-x86-64.so.2 --library-path /tools/lib /tools/bin/fio \
        --thread --size="$size" --randrepeat=0 --norandommap --group_reporting \
        --output-format=json "$@"
}
run_job() {
    name=$1
    shift
    say "FIO-BEGIN $name"
    fio --name="$name" "$@"
    say "FIO-END $name rc=$?"
}
run_job prefill --filename="$device" --ioengine=libaio --direct=1 --rw=write --bs=1M --iodepth=8
for job in randwrite randread; do
    for path in kernel socket; do
        case $path in
            kernel) target="--filename=$device --ioengine=libaio --direct=1" ;;
            socket) target="--ioengine=nbd --uri=nbd+unix:///$volume?socket=$socket" ;;
        esac
        # shellcheck disable=SC2086
        run_job "$path-$job" $target --rw=$job --bs=4k --iodepth=32 \
            --runtime="$runtime" --ramp_time=1 --time_based
    done
done
umount /tools
kill "$(cat /tmp/node.pid)"
say "RESULT ok"
