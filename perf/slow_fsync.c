/* A slow disk that can lose power, for `c2dtn perf fsync` and `c2dtn perf powerloss`.
 * LD_PRELOAD this into a process:
 *
 *   C2_FSYNC_DELAY_MS=N   every fsync and fdatasync takes N milliseconds longer (an SD card
 *                         or eMMC on an edge box, whose fsync takes tens of milliseconds);
 *   C2_DURABLE_DIR=D      at every fsync/fdatasync the file's contents are copied to D (one
 *                         copy per path, replaced atomically): what a disk would still hold
 *                         after a power cut, if it kept exactly what was fsynced and nothing
 *                         else (as LazyFS does, file by file).  Copied as the call starts:
 *                         what was written before it is durable once it returns.
 *
 * Written here because no package does this: kernel dm-delay and dm-flakey are not
 * available on these machines, and a FUSE filesystem would slow every read and write,
 * not only the flush. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

static void c2_slow_disk(void) {
    const char *v = getenv("C2_FSYNC_DELAY_MS");
    long ms = v ? atol(v) : 0;
    if (ms > 0) {
        struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
        while (nanosleep(&ts, &ts) != 0) {}
    }
}

static void c2_keep_durable(int fd) {
    const char *dir = getenv("C2_DURABLE_DIR");
    char link[64], path[4096], shadow[8192], tmp[8300], buf[65536];
    if (!dir) return;
    snprintf(link, sizeof link, "/proc/self/fd/%d", fd);
    ssize_t n = readlink(link, path, sizeof path - 1);
    if (n <= 0) return;
    path[n] = 0;
    if (strncmp(path, dir, strlen(dir)) == 0) return;  /* our own copies */
    size_t j = snprintf(shadow, sizeof shadow, "%s/", dir);
    for (ssize_t i = 0; i < n && j < sizeof shadow - 1; i++) shadow[j++] = path[i] == '/' ? '%' : path[i];
    shadow[j] = 0;
    snprintf(tmp, sizeof tmp, "%s.%ld.tmp", shadow, (long)syscall(SYS_gettid));
    int src = open(path, O_RDONLY | O_CLOEXEC);
    if (src < 0) return;
    int dst = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    if (dst < 0) { close(src); return; }
    ssize_t got;
    while ((got = read(src, buf, sizeof buf)) > 0)
        if (write(dst, buf, got) != got) break;
    close(src);
    close(dst);
    rename(tmp, shadow);
}

int fsync(int fd) {
    static int (*real)(int);
    if (!real) real = (int (*)(int))dlsym(RTLD_NEXT, "fsync");
    c2_keep_durable(fd);
    c2_slow_disk();
    return real(fd);
}

int fdatasync(int fd) {
    static int (*real)(int);
    if (!real) real = (int (*)(int))dlsym(RTLD_NEXT, "fdatasync");
    c2_keep_durable(fd);
    c2_slow_disk();
    return real(fd);
}
