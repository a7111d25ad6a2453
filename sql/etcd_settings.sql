-- lockfence.etcd_endpoints: every endpoint is an http:// or https:// URL
-- with a host; a bad list is refused when set, not at the first request.
CREATE EXTENSION lockfence;
\set VERBOSITY default

SET lockfence.etcd_endpoints = 'http://127.0.0.1:2379, https://etcd-2:2379/';
SHOW lockfence.etcd_endpoints;
SET lockfence.etcd_endpoints = 'ftp://127.0.0.1:2379';
SET lockfence.etcd_endpoints = 'http://127.0.0.1:2379,http://a b';
SET lockfence.etcd_endpoints = '';
-- a scheme alone, or with slashes only: no host (found by fuzz_endpoints)
SET lockfence.etcd_endpoints = 'http://';
SET lockfence.etcd_endpoints = 'HTTP:///';
SET lockfence.etcd_endpoints = 'http://127.0.0.1:2379,https://';
SELECT :'LAST_ERROR_SQLSTATE' AS sqlstate;
-- the setting in force is still the last good one
SHOW lockfence.etcd_endpoints;
-- (1.11) no user name or password in a URL: every role can read the
-- setting, and the errors that name an endpoint
SET lockfence.etcd_endpoints = 'http://etcduser:s3cret@127.0.0.1:2379';
SET lockfence.etcd_endpoints = 'http://127.0.0.1:2379, https://u@etcd-2:2379/v3';
SHOW lockfence.etcd_endpoints;
-- an @ after the host is no user name
SET lockfence.etcd_endpoints = 'http://127.0.0.1:2379/a@b';
SHOW lockfence.etcd_endpoints;
SET lockfence.etcd_endpoints = 'http://127.0.0.1:2379, https://etcd-2:2379/';

-- a key that is not a lock key is refused before any request, and a long
-- one is named by its start (1.10: it was repeated whole, up to 1.5 MB)
SELECT lockfence.etcd_unlock('no-lease-id');
SELECT lockfence.etcd_unlock(repeat('k', 100000));

DROP EXTENSION lockfence;
