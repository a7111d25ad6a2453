# lockfence: PGXS build
#
# The extension's install script is assembled from one SQL file per
# responsibility under sql/, in the order listed in SQL_PARTS.

EXTENSION = lockfence
EXTVERSION = 1.0

MODULE_big = lockfence
OBJS = $(patsubst %.c,%.o,$(sort $(wildcard src/*.c)))

SQL_PARTS = sql/core.sql sql/trigger.sql sql/metrics.sql $(wildcard sql/etcd.sql)
DATA_built = lockfence--$(EXTVERSION).sql

PG_CPPFLAGS = -I$(srcdir)/src $(shell curl-config --cflags)
SHLIB_LINK = $(shell curl-config --libs)

# Regression and isolation suites each start a private server (the two
# folders differ because the TAP step wipes tmp_check).
REGRESS = functions triggers
REGRESS_OPTS = --inputdir=test --temp-instance=tmp_regress
ISOLATION =
ISOLATION_OPTS = --inputdir=test --temp-instance=tmp_isolation

TAP_TESTS = 1
PROVE_TESTS = test/t/*.pl
PROVE_FLAGS = -I test/perl

EXTRA_CLEAN = tmp_regress tmp_isolation

PG_CONFIG ?= pg_config
PGXS := $(shell $(PG_CONFIG) --pgxs)
include $(PGXS)

lockfence--$(EXTVERSION).sql: $(SQL_PARTS)
	cat $^ > $@
