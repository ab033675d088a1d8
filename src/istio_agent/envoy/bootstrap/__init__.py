"""Envoy's bootstrap: upstream's options derived once (`values`), rendered built in (`render`) or through a custom
Go template (`params`, `template`, `template_funcs`, `gofmt`), with its listeners, stats and tracing parts.

All pure but `render.write_bootstrap`, the edge that writes the file. `options.BootstrapOptions` is what the
options resolver builds. Imports nothing: the resolver loads `options` alone.
"""
