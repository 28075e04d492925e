# dtn7-rs, the default agent: built once per version with cargo into the cache outside the clone
# (about 4 minutes on a fresh machine, docs/install.md) and linked into .tools/; `make tools`.
DTN7_VERSION := 0.21.0
DTN7_ROOT := $(C2DTN_CACHE)/dtn7-$(DTN7_VERSION)
TOOLS += $(DTN7_ROOT)/bin/dtnd
TOOLS_LINKS += $(DTN7_ROOT):dtn7

# the newest rust-version among dtn7-rs's locked dependencies (clap 4.5); Debian 12's own rustc is older
DTN7_RUST := 1.74
$(DTN7_ROOT)/bin/dtnd:
	@have=$$(rustc --version 2>/dev/null | cut -d' ' -f2); \
	if [ -z "$$have" ] || ! command -v cargo >/dev/null || \
	   [ "$$(printf '%s\n' $(DTN7_RUST) "$$have" | sort -V | head -1)" != $(DTN7_RUST) ]; then \
	  echo "dtn7-rs $(DTN7_VERSION) is built with cargo and needs Rust $(DTN7_RUST) or newer; found: $${have:-no rustc}." >&2; \
	  echo "Debian 12's rustc is 1.63: install a current one with rustup (https://rustup.rs), then run make again." >&2; \
	  exit 1; fi
	@echo "building dtn7-rs $(DTN7_VERSION) into $(DTN7_ROOT) (once per machine, about 4 minutes)"
	rm -rf $(DTN7_ROOT).partial
	cargo install dtn7 --version $(DTN7_VERSION) --locked --root $(DTN7_ROOT).partial
	rm -rf $(DTN7_ROOT) && mv $(DTN7_ROOT).partial $(DTN7_ROOT)
