/* lockfence: operational metrics (need lockfence in shared_preload_libraries) */

CREATE FUNCTION lockfence.read_metrics(OUT name text, OUT value bigint)
RETURNS SETOF record
AS 'MODULE_PATHNAME', 'lockfence_read_metrics'
LANGUAGE C VOLATILE STRICT;

COMMENT ON FUNCTION lockfence.read_metrics() IS
    'Cluster-wide lockfence counters (needs shared_preload_libraries)';

CREATE FUNCTION lockfence.read_rejections(OUT resource text,
                                          OUT rejections bigint,
                                          OUT last_rejected_token bigint,
                                          OUT highest_token bigint,
                                          OUT last_rejected_at timestamptz)
RETURNS SETOF record
AS 'MODULE_PATHNAME', 'lockfence_read_rejections'
LANGUAGE C VOLATILE STRICT;

COMMENT ON FUNCTION lockfence.read_rejections() IS
    'Resources with the most rejected fencing tokens (bounded list)';

CREATE FUNCTION lockfence.read_histograms(OUT name text,
                                          OUT le float8[],
                                          OUT buckets bigint[],
                                          OUT sum float8,
                                          OUT count bigint)
RETURNS SETOF record
AS 'MODULE_PATHNAME', 'lockfence_read_histograms'
LANGUAGE C VOLATILE STRICT;

COMMENT ON FUNCTION lockfence.read_histograms() IS
    'Lock acquisition and hold time histograms, Prometheus style';

CREATE FUNCTION lockfence.reset_metrics()
RETURNS void
AS 'MODULE_PATHNAME', 'lockfence_reset_metrics'
LANGUAGE C VOLATILE STRICT;

COMMENT ON FUNCTION lockfence.reset_metrics() IS
    'Set all lockfence metrics to zero (operators only)';

REVOKE ALL ON FUNCTION lockfence.reset_metrics() FROM PUBLIC;

-- One row per counter.
CREATE VIEW lockfence.metrics AS
    SELECT name, value FROM lockfence.read_metrics();

COMMENT ON VIEW lockfence.metrics IS
    'Cluster-wide lockfence counters since start or reset_metrics()';

-- The resources with the most rejected tokens, most rejected first.
CREATE VIEW lockfence.rejections AS
    SELECT resource, rejections, last_rejected_token, highest_token,
           last_rejected_at
      FROM lockfence.read_rejections()
     ORDER BY rejections DESC, last_rejected_at DESC;

COMMENT ON VIEW lockfence.rejections IS
    'Rejected fencing tokens per resource, for the most rejected resources';

-- One row per histogram: finite upper bounds, cumulative counts for them,
-- sum, and count (the +Inf bucket).
CREATE VIEW lockfence.histograms AS
    SELECT name, le, buckets, sum, count FROM lockfence.read_histograms();

COMMENT ON VIEW lockfence.histograms IS
    'Histograms: finite bucket bounds, cumulative counts, sum and count';

-- The same, one row per bucket, the +Inf bucket included.
CREATE VIEW lockfence.histogram_buckets AS
    SELECT h.name, b.le, b.count
      FROM lockfence.read_histograms() AS h,
           LATERAL (SELECT u.le, u.count
                      FROM unnest(h.le, h.buckets) AS u(le, count)
                    UNION ALL
                    SELECT 'Infinity'::float8, h.count) AS b
     ORDER BY h.name, b.le;

COMMENT ON VIEW lockfence.histogram_buckets IS
    'Histogram buckets, one row per upper bound (le), cumulative';

GRANT SELECT ON lockfence.metrics, lockfence.rejections, lockfence.histograms,
    lockfence.histogram_buckets TO PUBLIC;

