# lockfence: PGXS build
#
# The install and upgrade scripts at the top level are frozen once their
# version is released (test/release-checksums lists them; a test fails if
# one changes): every SQL change goes into the next version's upgrade
# script and its install script.

EXTENSION = lockfence
EXTVERSION = $(shell sed -n "s/^default_version = '\(.*\)'/\1/p" lockfence.control)

MODULE_big = lockfence
OBJS = $(patsubst %.c,%.o,$(sort $(wildcard src/*.c)))
DATA = $(sort $(wildcard lockfence--*.sql))

PG_CPPFLAGS = -I$(srcdir)/src $(shell curl-config --cflags)
SHLIB_LINK = $(shell curl-config --libs)

# Test hooks (the C function lockfence_metrics_test_event, the setting
# lockfence.debug_disable_fastpath and the etcd client's fault points,
# LOCKFENCE_FAULT_INJECTION) are compiled only when make is given
# LOCKFENCE_TEST_HOOKS=1, as test/run-all.sh does for its test builds: a
# plain make install ships none.  Objects are not rebuilt when this
# changes: make clean first.
ifeq ($(LOCKFENCE_TEST_HOOKS),1)
PG_CPPFLAGS += -DLOCKFENCE_TEST_HOOKS
endif

# pg_regress: sql/NAME.sql, compared with expected/NAME.out.  The
# regression and isolation suites each start a private server (the two
# folders differ because the TAP step wipes tmp_check).
REGRESS = $(sort $(basename $(notdir $(wildcard sql/*.sql))))
REGRESS_OPTS = --temp-instance=tmp_regress

# Isolation specs: test/specs/NAME.spec, compared with test/expected/NAME.out.
ISOLATION = $(sort $(basename $(notdir $(wildcard test/specs/*.spec))))
ISOLATION_OPTS = --inputdir=test --temp-instance=tmp_isolation

TAP_TESTS = 1
PROVE_TESTS = test/t/*.pl

EXTRA_CLEAN = tmp_regress tmp_isolation

PG_CONFIG ?= pg_config
PGXS := $(shell $(PG_CONFIG) --pgxs)
include $(PGXS)

# After the include: Makefile.global resets PROVE_FLAGS.
PROVE_FLAGS += -I test/perl

# Release archive (PGXN): make dist writes dist/lockfence-VERSION.zip, VERSION
# being META.json's, from the committed tree at git HEAD (uncommitted changes
# are not in it), under the folder lockfence-VERSION/.  .gitattributes
# (export-ignore) leaves out what users do not need.  DISTDIR chooses another
# output folder.
DISTVERSION = $(shell sed -n 's/^   "version": *"\([^"]*\)".*/\1/p' $(srcdir)/META.json)
DISTNAME = $(EXTENSION)-$(DISTVERSION)
DISTDIR ?= dist
EXTRA_CLEAN += dist

.PHONY: dist
dist:
	@test "$$(git -C $(srcdir) rev-parse --show-toplevel 2>/dev/null)" = "$$(cd $(srcdir) && pwd -P)" || \
		{ echo "make dist: $(srcdir) is not the top of a git checkout" >&2; exit 1; }
	@test -n "$(DISTVERSION)" || { echo "make dist: no version in META.json" >&2; exit 1; }
	mkdir -p $(DISTDIR)
	git -C $(srcdir) archive --format=zip --prefix=$(DISTNAME)/ \
		--output=$(abspath $(DISTDIR))/$(DISTNAME).zip HEAD
	@echo "make dist: wrote $(DISTDIR)/$(DISTNAME).zip"
