//go:build tools

// Package servers pins the upstream VictoriaMetrics release FlopWatch's tests run against; the
// setup script builds its binaries from this module (scripts/build-servers.sh).
package servers

import (
	_ "github.com/VictoriaMetrics/VictoriaMetrics/app/victoria-metrics"
	_ "github.com/VictoriaMetrics/VictoriaMetrics/app/vmagent"
	_ "github.com/VictoriaMetrics/VictoriaMetrics/app/vmalert"
)
