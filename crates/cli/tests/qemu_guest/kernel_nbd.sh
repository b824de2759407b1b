#!/bin/busybox sh
# /init of the kernel nbd guest (tests/kernel_nbd.rs): a single-node
# trireme on the guest's disk (/dev/vda, ext4, made by the host) makes a
# volume's block device with the kernel's nbd module, and the daemon is
# killed (SIGKILL) and started again while a writer writes to a file
# system on that device; then the daemon is stopped (SIGSTOP) until the
# kernel, past its request timeout, gives the connection up, and the
# daemon, continued, must reconnect on the kernel's LINK_DEAD event. Then
# the volume grows over the REST API, the daemon grows the device in
# place and resize2fs grows the mounted ext4, the writer still writing;
# then the same for an xfs with xfs_growfs. With trireme.scenario=NAME on
# the kernel command line it runs /NAME.sh instead. Every line the test reads
# starts with "TRIREME " on the serial console; the last is "RESULT ok"
# or "RESULT fail: why".
/bin/busybox --install -s /bin
export PATH=/sbin:/bin
mount -t proc proc /proc
mount -t sysfs sys /sys
mount -t devtmpfs dev /dev
mkdir -p /tmp /data /mnt /etc
# e2fsck asks the mount table whether the device is mounted.
ln -sf /proc/mounts /etc/mtab
mount -t tmpfs tmp /tmp
for module in $(cat /modules/order); do insmod /modules/$module; done
say() { echo "TRIREME $*"; }
end() {
    sync
    poweroff -f
}
fail() {
    say "RESULT fail: $*"
    echo "--- node log (last lines) ---"
    tail -n 40 /data/node.log 2>/dev/null
    echo "--- kernel log (nbd) ---"
    dmesg | grep -i -E 'nbd|block' | tail -n 20
    end
}
ip link set lo up
i=0
while [ ! -b /dev/vda ] && [ $i -lt 100 ]; do sleep 0.1; i=$((i + 1)); done
mount -t ext4 /dev/vda /data || fail "cannot mount the data disk"
[ -d /sys/module/nbd ] || fail "the nbd module is not loaded"
say "BOOTED"

api=127.0.0.1:7450
start_node() {
    setsid trireme node run --data-dir /data/trireme --name guest \
        --api-listen $api --nbd-listen 127.0.0.1:10809 --nbd-socket /data/nbd.sock \
        --kernel-nbd-request-timeout 5 \
        </dev/null >>/data/node.log 2>&1 &
    echo $! >/tmp/node.pid
    i=0
    until wget -q -O /dev/null "http://$api/api/v1/health" 2>/dev/null; do
        i=$((i + 1))
        [ $i -lt 300 ] || fail "the node did not answer within 30 s"
        sleep 0.1
    done
}
# One HTTP/1.0 request to the API (busybox wget cannot PUT or DELETE);
# the answer's status line, headers and body. The request goes through a
# fifo held open until the server has answered and closed: an end of
# input would half-close the socket, and the server takes that for a
# client gone and drops the request.
request() {
    rm -f /tmp/request
    mkfifo /tmp/request
    nc 127.0.0.1 7450 </tmp/request &
    nc_pid=$!
    exec 3>/tmp/request
    printf '%s %s HTTP/1.0\r\nHost: %s\r\nContent-Type: application/json\r\nContent-Length: %s\r\n\r\n%s' \
        "$1" "$2" "$api" "${#3}" "$3" >&3
    wait $nc_pid
    exec 3>&-
}
field() { sed -n "s/.*\"$1\":\"\\{0,1\\}\\([^\",}]*\\).*/\\1/p" | head -n 1; }

# trireme.scenario= on the kernel command line picks another scenario
# (proxmox.sh: the Proxmox plugin's kernel nbd path); none is this one.
scenario=$(sed -n 's/.*trireme\.scenario=\([a-z]*\).*/\1/p' /proc/cmdline)
if [ -n "$scenario" ]; then
    . "/$scenario.sh"
    end
fi

start_node
trireme --api "http://$api" volume create vol --size 256M >/tmp/create.log 2>&1 ||
    fail "volume create: $(cat /tmp/create.log)"
answer=$(request PUT /api/v1/volumes/vol/device '{"node":"guest"}')
device=$(echo "$answer" | field device)
kind=$(echo "$answer" | field kind)
say "DEVICE $device kind=$kind"
[ "$kind" = kernel-nbd ] || fail "no kernel device: $answer"
[ -b "$device" ] || fail "$device is not a block device"
mkfs.ext4 -q -F "$device" >/tmp/mkfs.log 2>&1 || fail "mkfs.ext4: $(cat /tmp/mkfs.log)"
mount -t ext4 "$device" /mnt || fail "cannot mount $device"
dd if=/dev/urandom of=/mnt/before bs=1M count=8 2>/dev/null && sync || fail "writing before"
sha256sum /mnt/before >/tmp/sums

# The writer: until /tmp/writer.stop appears (at most 200 files), each
# file synced before its checksum is kept. It records how long its
# slowest file took (the pause) and how it ended.
writer() {
    n=0
    slowest=0
    while [ ! -e /tmp/writer.stop ] && [ $n -lt 200 ]; do
        n=$((n + 1))
        dd if=/dev/urandom of=/tmp/data bs=64k count=4 2>/dev/null
        started=$(date +%s)
        dd if=/tmp/data of=/mnt/w.$n bs=64k conv=fsync 2>/tmp/writer.err || {
            echo "failed at file $n: $(cat /tmp/writer.err)" >/tmp/writer.status
            return
        }
        took=$(($(date +%s) - started))
        [ $took -gt $slowest ] && slowest=$took
        echo "$(sha256sum /tmp/data | cut -d' ' -f1)  /mnt/w.$n" >>/tmp/sums
        echo $n >/tmp/writer.done
        sleep 0.1
    done
    echo "ok files=$n slowest=${slowest}s" >/tmp/writer.status
}
written() { cat /tmp/writer.done 2>/dev/null || echo 0; }
# Waits (up to 150 s) until the writer has written $1 files.
wait_for_files() {
    i=0
    until [ "$(written)" -ge "$1" ]; do
        i=$((i + 1))
        [ $i -lt 1500 ] || fail "the writer did not reach file $1 within 150 s (at $(written))"
        kill -0 $writer_pid 2>/dev/null || fail "the writer ended: $(cat /tmp/writer.status)"
        sleep 0.1
    done
}
writer &
writer_pid=$!
wait_for_files 5
kill -9 "$(cat /tmp/node.pid)"
say "KILLED after file $(written)"
sleep 2
start_node
say "RESTARTED at file $(written)"
wait_for_files $(($(written) + 5))
grep -q "fresh connection" /data/node.log || fail "the restarted node did not reconnect the device"
# The node's --kernel-nbd-request-timeout reached the kernel (its default
# is 10 s; the queue shows milliseconds).
nbd=${device#/dev/}
[ "$(cat /sys/block/$nbd/queue/io_timeout)" = 5000 ] ||
    fail "the device's request timeout is $(cat /sys/block/$nbd/queue/io_timeout) ms, not the 5000 the node was given"
# The node stops answering until the kernel gives the connection up and
# tells of it (LINK_DEAD), which the daemon reads once continued. How long
# that takes is not fixed: a request the daemon has not answered times out
# after 5 s, but one still being sent into the stopped daemon's full
# socket holds its timer back, and its send gives up only after 5 s
# without progress (the socket's send timeout), each time.
given_up() {
    dmesg | grep -c -E "$nbd: (Connection timed out|Send (control|data) failed|Request send failed)"
}
before=$(given_up)
kill -STOP "$(cat /tmp/node.pid)"
say "STOPPED after file $(written)"
i=0
until [ "$(given_up)" -gt "$before" ]; do
    i=$((i + 1))
    [ $i -lt 600 ] || fail "the kernel kept the connection of the stopped node for 60 s"
    sleep 0.1
done
kill -CONT "$(cat /tmp/node.pid)"
say "CONTINUED at file $(written), the kernel let go after about $((i / 10)).$((i % 10)) s"
wait_for_files $(($(written) + 5))
reconnects=$(grep -c "fresh connection" /data/node.log)
[ "$reconnects" -ge 2 ] || fail "the continued node did not reconnect the device ($reconnects reconnects)"

# Online growth: the volume grows over the REST API while its ext4 is
# mounted and the writer writes. Nothing else is asked of the daemon: it
# follows the cluster state and gives the device the new size itself
# (NBD_CMD_RECONFIGURE), on the connection it has, which was negotiated
# at the old size. Then resize2fs grows the mounted ext4.
device_bytes() { echo $(($(cat /sys/block/$nbd/size) * 512)); }
old_bytes=$(device_bytes)
new_bytes=$((old_bytes + 128 * 1024 * 1024))
answer=$(request POST /api/v1/volumes/vol/grow "{\"size_bytes\":$new_bytes}")
case "$answer" in *" 200"*) ;; *) fail "growing the volume: $answer" ;; esac
i=0
until [ "$(device_bytes)" -eq $new_bytes ]; do
    i=$((i + 1))
    [ $i -lt 200 ] || fail "/sys/block/$nbd/size shows $(device_bytes) bytes 20 s after the volume grew to $new_bytes"
    sleep 0.1
done
say "GREW $device from $old_bytes to $(device_bytes) bytes"
# The last block, past the old end, straight from the device.
dd if="$device" of=/dev/null bs=4096 skip=$((new_bytes / 4096 - 1)) count=1 iflag=direct \
    2>/tmp/dd.err || fail "reading past the old end: $(cat /tmp/dd.err)"
df_kib() { df -k /mnt | awk 'NR == 2 { print $2 }'; }
df_before=$(df_kib)
resize2fs "$device" >/tmp/resize.log 2>&1 || fail "resize2fs online: $(tail -n 5 /tmp/resize.log)"
df_after=$(df_kib)
say "RESIZED ext4 online from $df_before to $df_after KiB at file $(written)"
[ "$df_after" -gt $((df_before + 100 * 1024)) ] ||
    fail "df shows $df_after KiB after resize2fs (before: $df_before KiB)"
wait_for_files $(($(written) + 3))
touch /tmp/writer.stop
i=0
while kill -0 $writer_pid 2>/dev/null; do
    i=$((i + 1))
    [ $i -lt 1800 ] || fail "the writer did not finish within 180 s"
    sleep 0.1
done
status=$(cat /tmp/writer.status 2>/dev/null)
say "WRITER $status"
case "$status" in ok*) ;; *) fail "the writer failed: $status" ;; esac

# Read everything back from the device itself, not the page cache.
umount /mnt || fail "cannot unmount $device"
echo 3 >/proc/sys/vm/drop_caches
e2fsck -f -n "$device" >/tmp/fsck.log 2>&1 || fail "e2fsck: $(tail -n 5 /tmp/fsck.log)"
mount -t ext4 "$device" /mnt || fail "cannot mount $device again"
sha256sum -c /tmp/sums >/tmp/check.log 2>&1 || fail "checksums: $(grep -v ': OK$' /tmp/check.log | head -n 5)"
say "VERIFIED $(wc -l </tmp/sums) files"
umount /mnt || fail "cannot unmount $device at the end"

answer=$(request DELETE /api/v1/volumes/vol/device '')
case "$answer" in *" 20"[04]*) ;; *) fail "DELETE device: $answer" ;; esac
size=$(blockdev --getsize64 "$device" 2>/dev/null || echo gone)
[ "$size" = 0 ] || [ "$size" = gone ] || fail "$device still has $size bytes after DELETE"
answer=$(request GET /api/v1/devices '')
case "$answer" in *'"volume":"vol"'*) fail "the device is still listed: $answer" ;; esac
say "RELEASED $device"

# The same for xfs: a second volume's device, an xfs on it (xfsprogs
# refuses one under 300 MB), grown over the REST API while mounted, then
# xfs_growfs on the mount. This one is attached first, as every CSI
# volume is: it is served through its replication engine, which takes
# the new size while it runs.
trireme --api "http://$api" volume create xfsvol --size 320M >/tmp/create.log 2>&1 ||
    fail "volume create xfsvol: $(cat /tmp/create.log)"
trireme --api "http://$api" volume attach xfsvol --node guest >/tmp/attach.log 2>&1 ||
    fail "volume attach xfsvol: $(cat /tmp/attach.log)"
answer=$(request PUT /api/v1/volumes/xfsvol/device '{"node":"guest"}')
device=$(echo "$answer" | field device)
[ -b "$device" ] || fail "no device for xfsvol: $answer"
nbd=${device#/dev/}
mkfs.xfs -q -K "$device" >/tmp/mkfs.log 2>&1 || fail "mkfs.xfs: $(cat /tmp/mkfs.log)"
mkdir -p /xfs
mount -t xfs "$device" /xfs || fail "cannot mount the xfs on $device"
dd if=/dev/urandom of=/xfs/before bs=1M count=4 2>/dev/null && sync || fail "writing to the xfs"
sha256sum /xfs/before >/tmp/xfs.sums
old_bytes=$(device_bytes)
new_bytes=$((old_bytes + 128 * 1024 * 1024))
answer=$(request POST /api/v1/volumes/xfsvol/grow "{\"size_bytes\":$new_bytes}")
case "$answer" in *" 200"*) ;; *) fail "growing xfsvol: $answer" ;; esac
i=0
until [ "$(device_bytes)" -eq $new_bytes ]; do
    i=$((i + 1))
    [ $i -lt 200 ] || fail "/sys/block/$nbd/size shows $(device_bytes) bytes 20 s after xfsvol grew to $new_bytes"
    sleep 0.1
done
grep -q "the engine serves the volume's new size" /data/node.log ||
    fail "xfsvol's device grew, but not through its engine"
xfs_kib() { df -k /xfs | awk 'NR == 2 { print $2 }'; }
df_before=$(xfs_kib)
xfs_growfs /xfs >/tmp/growfs.log 2>&1 || fail "xfs_growfs: $(tail -n 5 /tmp/growfs.log)"
df_after=$(xfs_kib)
say "XFS GREW $device from $old_bytes to $(device_bytes) bytes, df $df_before to $df_after KiB"
[ "$df_after" -gt $((df_before + 100 * 1024)) ] ||
    fail "df shows $df_after KiB after xfs_growfs (before: $df_before KiB)"
dd if=/dev/urandom of=/xfs/after bs=1M count=4 2>/dev/null && sync || fail "writing to the grown xfs"
sha256sum /xfs/after >>/tmp/xfs.sums
umount /xfs || fail "cannot unmount the xfs"
echo 3 >/proc/sys/vm/drop_caches
xfs_repair -n "$device" >/tmp/repair.log 2>&1 || fail "xfs_repair -n: $(tail -n 5 /tmp/repair.log)"
mount -t xfs "$device" /xfs || fail "cannot mount the xfs again"
sha256sum -c /tmp/xfs.sums >/tmp/check.log 2>&1 || fail "xfs checksums: $(cat /tmp/check.log)"
umount /xfs || fail "cannot unmount the xfs at the end"
answer=$(request DELETE /api/v1/volumes/xfsvol/device '')
case "$answer" in *" 20"[04]*) ;; *) fail "DELETE xfsvol device: $answer" ;; esac
say "XFS VERIFIED"
kill "$(cat /tmp/node.pid)"
say "RESULT ok $status"
end
