/* A slow disk for `c2dtn perf fsync`: LD_PRELOAD this into a process and every fsync and
 * fdatasync it makes takes C2_FSYNC_DELAY_MS milliseconds longer (an SD card or eMMC on an
 * edge box, whose fsync takes tens of milliseconds).  Written here because no package does
 * this alone: kernel dm-delay is not available on these machines, and a FUSE filesystem
 * would slow every read and write, not only the flush. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdlib.h>
#include <time.h>

static void c2_slow_disk(void) {
    const char *v = getenv("C2_FSYNC_DELAY_MS");
    long ms = v ? atol(v) : 0;
    if (ms > 0) {
        struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
        while (nanosleep(&ts, &ts) != 0) {}
    }
}

int fsync(int fd) {
    static int (*real)(int);
    if (!real) real = (int (*)(int))dlsym(RTLD_NEXT, "fsync");
    c2_slow_disk();
    return real(fd);
}

int fdatasync(int fd) {
    static int (*real)(int);
    if (!real) real = (int (*)(int))dlsym(RTLD_NEXT, "fdatasync");
    c2_slow_disk();
    return real(fd);
}
