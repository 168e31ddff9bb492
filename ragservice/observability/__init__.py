"""What a running service tells its operators about each request beyond metrics: OpenTelemetry
traces (`tracing`, optional) and log lines that carry the request's id, tenant and route
(`logs`, text or JSON). A leaf package: it imports the other leaves (config, errors, extras,
timing) and nothing above them."""
