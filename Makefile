# lockfence: PGXS build
#
# The extension's scripts are assembled from one SQL file per
# responsibility under sql/.

EXTENSION = lockfence
EXTVERSION = 1.1

MODULE_big = lockfence
OBJS = $(patsubst %.c,%.o,$(sort $(wildcard src/*.c)))

# Version 1.0 is the fence core; 1.1 adds the metrics and the etcd locks.
# Each version's install script, and the upgrade script between them, are
# assembled from the same parts, so that an upgraded database and a fresh
# install cannot drift apart (test/t/50_upgrade.pl checks that they match).
SQL_1_0 = sql/core.sql sql/trigger.sql
SQL_1_1 = sql/metrics.sql sql/etcd.sql
DATA_built = lockfence--1.0.sql lockfence--1.0--1.1.sql lockfence--1.1.sql

PG_CPPFLAGS = -I$(srcdir)/src $(shell curl-config --cflags)
SHLIB_LINK = $(shell curl-config --libs)

# Regression and isolation suites each start a private server (the two
# folders differ because the TAP step wipes tmp_check).
REGRESS = functions triggers
REGRESS_OPTS = --inputdir=test --temp-instance=tmp_regress
ISOLATION = fence_race fence_share fence_savepoint fence_trigger fence_isolation_levels fence_waiter_locks
ISOLATION_OPTS = --inputdir=test --temp-instance=tmp_isolation

TAP_TESTS = 1
PROVE_TESTS = test/t/*.pl
PROVE_FLAGS = -I test/perl

EXTRA_CLEAN = tmp_regress tmp_isolation

PG_CONFIG ?= pg_config
PGXS := $(shell $(PG_CONFIG) --pgxs)
include $(PGXS)

# The Makefile is a prerequisite too: it says which parts make a script.
lockfence--1.0.sql: $(SQL_1_0) Makefile
	cat $(SQL_1_0) > $@

lockfence--1.1.sql: $(SQL_1_0) $(SQL_1_1) Makefile
	cat $(SQL_1_0) $(SQL_1_1) > $@

lockfence--1.0--1.1.sql: sql/update-guard.sql $(SQL_1_1) Makefile
	cat sql/update-guard.sql $(SQL_1_1) > $@
