/* c2dtn-ionbp: the c2dtn node's hand on an ION node's Bundle Protocol API (libbp).
 *
 * ION has no network API for applications: an application is a process attached to the
 * node's shared memory.  The ION driver (overlay/agents/ion.py) runs this helper in the
 * node's directory with its ION_NODE_LIST_DIR, and speaks to it over stdin/stdout in
 * length-prefixed frames, as one asyncio subprocess.  Written by hand because it is the
 * one thing no library does: link against ION's libbp and libici.
 *
 *   usage: c2dtn-ionbp OWN_EID          (e.g. ipn:5.1; the endpoint must be declared)
 *
 * ION prints its own messages on stdout: the helper keeps the frames on the stdout it was
 * given and points fd 1 at stderr before ION is touched.
 *
 * Every frame: u32 length (big-endian) of what follows, u8 type, body.
 *   to the helper    'S' u32 lifetime_s, u8 class of service (0 bulk, 1 standard,
 *                        2 expedited), u16 eid length, destination EID, payload
 *                    'Q' (no body): close the endpoint and exit
 *   from the helper  'R' own EID: attached and the endpoint is open
 *                    'A' u8 accepted (1) or refused (0), then the reason: one per 'S',
 *                        in order
 *                    'D' u16 eid length, source EID, u64 creation time (ms since
 *                        2000), payload: a bundle delivered to the endpoint
 *                    'X' text: a fatal error; the helper exits after it
 * A payload larger than MAX_PAYLOAD is refused.  On end of input the helper closes the
 * endpoint and detaches from ION (never ionstop: other nodes run on the same host).
 */

#include <bp.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define MAX_PAYLOAD (16u << 20)

static pthread_mutex_t out_lock = PTHREAD_MUTEX_INITIALIZER;
static BpSAP sap;
static volatile int running = 1;
static int outfd = 1;  /* the frames' channel: the original stdout (ION prints on fd 1, sent to stderr) */

static int read_full(void *buf, size_t n)
{
	unsigned char *p = buf;
	while (n > 0) {
		ssize_t r = read(0, p, n);
		if (r <= 0)
			return -1;
		p += r;
		n -= (size_t) r;
	}
	return 0;
}

static int write_full(const void *buf, size_t n)
{
	const unsigned char *p = buf;
	while (n > 0) {
		ssize_t w = write(outfd, p, n);
		if (w <= 0)
			return -1;
		p += w;
		n -= (size_t) w;
	}
	return 0;
}

static void put_u16(unsigned char *p, unsigned v) { p[0] = v >> 8; p[1] = v; }
static void put_u32(unsigned char *p, uint32_t v) { p[0] = v >> 24; p[1] = v >> 16; p[2] = v >> 8; p[3] = v; }
static uint32_t get_u32(const unsigned char *p) { return (uint32_t) p[0] << 24 | p[1] << 16 | p[2] << 8 | p[3]; }

/* One frame out: type, then the parts, under the output lock (two threads write). */
static int frame(char type, const void *a, size_t alen, const void *b, size_t blen)
{
	unsigned char head[5];
	int rc = 0;
	put_u32(head, (uint32_t) (1 + alen + blen));
	head[4] = (unsigned char) type;
	pthread_mutex_lock(&out_lock);
	if (write_full(head, 5) < 0 || (alen && write_full(a, alen) < 0) || (blen && write_full(b, blen) < 0))
		rc = -1;
	pthread_mutex_unlock(&out_lock);
	return rc;
}

static void answer(int ok, const char *why)
{
	unsigned char flag = ok ? 1 : 0;
	frame('A', &flag, 1, why, strlen(why));
}

static void *receiver(void *arg)
{
	Sdr sdr = bp_get_sdr();
	BpDelivery dlv;
	ZcoReader reader;
	unsigned char *buf = malloc(MAX_PAYLOAD);
	(void) arg;
	while (running) {
		if (bp_receive(sap, &dlv, BP_BLOCKING) < 0) {
			const char *m = "bp_receive failed";
			frame('X', m, strlen(m), NULL, 0);
			break;
		}
		if (dlv.result == BpEndpointStopped)
			break;
		if (dlv.result != BpPayloadPresent) {
			bp_release_delivery(&dlv, 1);
			continue;
		}
		if (!sdr_begin_xn(sdr)) {
			bp_release_delivery(&dlv, 1);
			break;
		}
		vast len = zco_source_data_length(sdr, dlv.adu);
		sdr_exit_xn(sdr);
		if (len < 0 || len > MAX_PAYLOAD) {
			bp_release_delivery(&dlv, 1);  /* too large for a c2dtn container: dropped */
			continue;
		}
		zco_start_receiving(dlv.adu, &reader);
		if (!sdr_begin_xn(sdr)) {
			bp_release_delivery(&dlv, 1);
			break;
		}
		vast got = zco_receive_source(sdr, &reader, len, (char *) buf);
		if (sdr_end_xn(sdr) < 0 || got != len) {
			bp_release_delivery(&dlv, 1);
			continue;
		}
		const char *src = dlv.bundleSourceEid ? dlv.bundleSourceEid : "";
		size_t slen = strlen(src);
		unsigned char *meta = malloc(2 + slen + 8);
		put_u16(meta, (unsigned) slen);
		memcpy(meta + 2, src, slen);
		uint64_t ms = dlv.bundleCreationTime.msec;
		for (int i = 0; i < 8; i++)
			meta[2 + slen + i] = (unsigned char) (ms >> (56 - 8 * i));
		int rc = frame('D', meta, 2 + slen + 8, buf, (size_t) len);
		free(meta);
		bp_release_delivery(&dlv, 1);
		if (rc < 0)
			break;
	}
	free(buf);
	running = 0;
	return NULL;
}

static void send_one(unsigned char *body, uint32_t n)
{
	if (n < 7) {
		answer(0, "short send frame");
		return;
	}
	uint32_t lifetime = get_u32(body);
	int cos = body[4] <= 2 ? body[4] : BP_STD_PRIORITY;
	unsigned elen = (unsigned) body[5] << 8 | body[6];
	if (7 + elen > n) {
		answer(0, "destination EID runs past the frame");
		return;
	}
	char eid[512];
	if (elen >= sizeof eid) {
		answer(0, "destination EID too long");
		return;
	}
	memcpy(eid, body + 7, elen);
	eid[elen] = '\0';
	unsigned char *payload = body + 7 + elen;
	vast plen = n - 7 - elen;
	/* allocated and written in one transaction, as ION's own bpsource does (a bounded SDR lets a
	   transaction write only what it allocated); the node's SDR working memory is sized for a
	   16 MB payload's log (sdrWmSize in the driver's .ionconfig) */
	Sdr sdr = bp_get_sdr();
	if (!sdr_begin_xn(sdr)) {
		answer(0, "ION's SDR refused a transaction");
		return;
	}
	Object extent = sdr_malloc(sdr, plen ? plen : 1);
	if (extent)
		sdr_write(sdr, extent, (char *) payload, plen);
	if (sdr_end_xn(sdr) < 0 || extent == 0) {
		answer(0, "no space in ION's SDR for the payload");
		return;
	}
	/* no attendant: when ZCO space is short, refuse now (the overlay keeps custody and resends) */
	Object zco = ionCreateZco(ZcoSdrSource, extent, 0, plen, cos, 0, ZcoOutbound, NULL);
	if (zco == 0 || zco == (Object) ERROR) {
		if (sdr_begin_xn(sdr)) {
			sdr_free(sdr, extent);
			sdr_end_xn(sdr);
		}
		answer(0, "ION has no ZCO space for the bundle now");
		return;
	}
	Object newBundle;
	int rc = bp_send(sap, eid, NULL, (int) lifetime, cos, NoCustodyRequested, 0, 0, NULL, zco, &newBundle);
	answer(rc == 1, rc == 1 ? "" : rc == 0 ? "bp_send refused the bundle (bad destination?)" : "bp_send failed");
}

int main(int argc, char **argv)
{
	if (argc != 2) {
		fprintf(stderr, "usage: %s OWN_EID\n", argv[0]);
		return 2;
	}
	outfd = dup(1);  /* ION writes messages to stdout: they must not land among the frames */
	if (outfd < 0 || dup2(2, 1) < 0) {
		perror("c2dtn-ionbp: dup");
		return 1;
	}
	if (bp_attach() < 0) {
		const char *m = "cannot attach to ION (is the node started, ION_NODE_LIST_DIR right?)";
		frame('X', m, strlen(m), NULL, 0);
		return 1;
	}
	if (bp_open(argv[1], &sap) < 0) {
		char m[600];
		snprintf(m, sizeof m, "cannot open endpoint %s (declared in bpadmin? another process on it?)", argv[1]);
		frame('X', m, strlen(m), NULL, 0);
		bp_detach();
		return 1;
	}
	frame('R', argv[1], strlen(argv[1]), NULL, 0);
	pthread_t rx;
	pthread_create(&rx, NULL, receiver, NULL);
	unsigned char head[5];
	unsigned char *body = malloc(MAX_PAYLOAD + 1024);
	while (running && read_full(head, 5) == 0) {
		uint32_t n = get_u32(head) - 1;
		if (n > MAX_PAYLOAD + 1024) {
			const char *m = "frame too large";
			frame('X', m, strlen(m), NULL, 0);
			break;
		}
		if (n && read_full(body, n) < 0)
			break;
		if (head[4] == 'S')
			send_one(body, n);
		else if (head[4] == 'Q')
			break;
		else
			answer(0, "unknown frame type");
	}
	running = 0;
	bp_interrupt(sap);
	pthread_join(rx, NULL);
	bp_close(sap);
	bp_detach();
	free(body);
	return 0;
}
