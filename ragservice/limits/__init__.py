"""The service's limits, one module per kind. A leaf package: it imports the leaves only.

- `shape`: fixed limits on input shape (external ids, JSON depth, collections per request,
  PostgreSQL's integers);
- `text`: what text can be stored (no NUL, no lone surrogate);
- `request_bounds`: the configured limits on a request's content (`RAGSERVICE_MAX_*`);
- `results`: how many results (`k`) a search or an answer gets when the request does not say;
- `documents`: how large one ingested document may be, and the time and memory its parse takes;
- `rate_limits`: per-key rate limits (token buckets) and what each request costs;
- `fair_slots`: `FairSlots`, a bounded number of things at once, shared fairly between tenants.
"""
