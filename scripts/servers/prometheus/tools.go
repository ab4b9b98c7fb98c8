//go:build tools

// Package servers pins the upstream Prometheus release FlopWatch's tests run against; the
// setup script builds its binaries from this module (scripts/build-servers.sh).
package servers

import (
	_ "github.com/prometheus/prometheus/cmd/prometheus"
	_ "github.com/prometheus/prometheus/cmd/promtool"
)
