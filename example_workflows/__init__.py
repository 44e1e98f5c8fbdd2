"""Real pipelines that run with Nipype's own plugins and with Sea."""
