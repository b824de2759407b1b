// The kernel work one replicated 4 KiB write cannot avoid on this machine,
// measured as CPU time (user + system of this process, every thread) per
// 4 KiB: what a replicated write's CPU cost is compared against (issue 24,
// item 4). Built and run by bench/cpu_floor.sh; each line it prints is
// "name us_per_4k".
//
// - link:    a 4 KiB payload with a 64-byte header over loopback TCP,
//            16 per writev, sender and receiver both counted (one hop of
//            the primary's copy to a replica).
// - ack:     a 64-byte message over loopback TCP, 16 per writev (a
//            replica's acknowledgement), sender and receiver both counted.
// - crc:     the CRC-32C of 4 KiB (SSE 4.2), as the store checksums a block.
// - journal: sequential buffered writes of 32 x 4 KiB per call, with the
//            write-back started from this process (sync_file_range), as
//            the store's bounded write-back does.
// - apply_buffered: a 4 KiB write at a random offset through the page
//            cache, write-back started from this process likewise (the
//            store's in-place apply today).
// - apply_direct: a 4 KiB O_DIRECT write at a random offset, one at a
//            time (an in-place write that bypasses the page cache).
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#define BLK 4096
#define HDR 64
#define LINK_BATCH 16
#include <nmmintrin.h>

static double cpu_seconds(void) {
    struct rusage r;
    getrusage(RUSAGE_SELF, &r);
    return r.ru_utime.tv_sec + r.ru_utime.tv_usec / 1e6 + r.ru_stime.tv_sec +
           r.ru_stime.tv_usec / 1e6;
}

static void die(const char *what) {
    perror(what);
    exit(1);
}

struct receiver {
    int fd;
    long bytes;
};

static void *receive_all(void *arg) {
    struct receiver *r = arg;
    char *buf = malloc(BLK * 64);
    for (long got = 0; got < r->bytes;) {
        ssize_t n = read(r->fd, buf, BLK * 64);
        if (n <= 0) die("read");
        got += n;
    }
    free(buf);
    return NULL;
}

static double link_cost(long blocks, size_t payload) {
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t len = sizeof a;
    int l = socket(AF_INET, SOCK_STREAM, 0);
    if (l < 0 || bind(l, (void *)&a, sizeof a) || getsockname(l, (void *)&a, &len) ||
        listen(l, 1))
        die("listen");
    int c = socket(AF_INET, SOCK_STREAM, 0);
    if (c < 0 || connect(c, (void *)&a, sizeof a)) die("connect");
    int s = accept(l, NULL, NULL);
    if (s < 0) die("accept");
    int one = 1;
    setsockopt(c, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    blocks -= blocks % LINK_BATCH;
    struct receiver r = {s, blocks * (long)(payload + HDR)};
    pthread_t t;
    static char header[HDR], data[BLK];
    memset(data, 7, BLK);
    double start = cpu_seconds();
    pthread_create(&t, NULL, receive_all, &r);
    for (long i = 0; i < blocks; i += LINK_BATCH) {
        struct iovec iov[2 * LINK_BATCH];
        int count = 0;
        for (int j = 0; j < LINK_BATCH; j++) {
            iov[count++] = (struct iovec){header, HDR};
            if (payload) iov[count++] = (struct iovec){data, payload};
        }
        for (int at = 0; at < count;) {
            ssize_t n = writev(c, iov + at, count - at);
            if (n < 0) die("writev");
            while (n > 0) {
                if ((size_t)n >= iov[at].iov_len) {
                    n -= iov[at].iov_len;
                    at++;
                } else {
                    iov[at].iov_base = (char *)iov[at].iov_base + n;
                    iov[at].iov_len -= n;
                    n = 0;
                }
            }
        }
    }
    pthread_join(t, NULL);
    double cost = (cpu_seconds() - start) * 1e6 / blocks;
    close(c);
    close(s);
    close(l);
    return cost;
}

static double write_cost(const char *path, int direct, int random, int per_call, long blocks) {
    const long size = 1L << 30;
    int fd = open(path, O_RDWR | O_CREAT | O_TRUNC | (direct ? O_DIRECT : 0), 0600);
    if (fd < 0) die("open");
    if (posix_fallocate(fd, 0, size)) die("posix_fallocate");
    if (!direct) posix_fadvise(fd, 0, 0, POSIX_FADV_RANDOM);
    char *data = aligned_alloc(BLK, (size_t)BLK * per_call);
    memset(data, 9, (size_t)BLK * per_call);
    uint64_t x = 88172645463325252ULL;
    long offset = 0;
    double start = cpu_seconds();
    for (long i = 0; i < blocks; i += per_call) {
        if (random) {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            offset = (long)(x % (size / BLK / per_call)) * BLK * per_call;
        }
        if (pwrite(fd, data, (size_t)BLK * per_call, offset) < 0) die("pwrite");
        if (!random) offset = (offset + (long)BLK * per_call) % size;
        if (!direct && (i / per_call) % 256 == 0)
            sync_file_range(fd, 0, 0, SYNC_FILE_RANGE_WRITE);
    }
    if (!direct) sync_file_range(fd, 0, 0, SYNC_FILE_RANGE_WAIT_BEFORE | SYNC_FILE_RANGE_WRITE |
                                                SYNC_FILE_RANGE_WAIT_AFTER);
    double cost = (cpu_seconds() - start) * 1e6 / blocks;
    free(data);
    close(fd);
    unlink(path);
    return cost;
}

__attribute__((target("sse4.2"))) static double crc_cost(long blocks) {
    static uint64_t data[BLK / 8];
    for (int i = 0; i < BLK / 8; i++) data[i] = i * 0x9e3779b97f4a7c15ULL;
    uint64_t crc = 0;
    double start = cpu_seconds();
    for (long i = 0; i < blocks * 20; i++) {
        data[0] = i;
        for (int j = 0; j < BLK / 8; j++) crc = _mm_crc32_u64(crc, data[j]);
    }
    double cost = (cpu_seconds() - start) * 1e6 / (blocks * 20);
    if (crc == 1) puts("");  // keeps the loop
    return cost;
}

int main(int argc, char **argv) {
    if (argc != 3) {
        fprintf(stderr, "usage: %s SCRATCH_DIR BLOCKS\n", argv[0]);
        return 2;
    }
    char path[4096];
    snprintf(path, sizeof path, "%s/cpu-floor-file", argv[1]);
    long blocks = atol(argv[2]);
    printf("link %.2f\n", link_cost(blocks, BLK));
    printf("ack %.2f\n", link_cost(blocks, 0));
    printf("crc %.3f\n", crc_cost(blocks));
    printf("journal %.2f\n", write_cost(path, 0, 0, 32, blocks));
    printf("apply_buffered %.2f\n", write_cost(path, 0, 1, 1, blocks));
    // One at a time, a device write each: a fifth as many keeps it short.
    printf("apply_direct %.2f\n", write_cost(path, 1, 1, 1, blocks / 5));
    return 0;
}
