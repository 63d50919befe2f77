// Package metricstest reads Prometheus endpoints in tests.
package metricstest

import (
	"bufio"
	"fmt"
	"net/http"
	"strconv"
	"strings"
)

// Value returns the value of series on the Prometheus endpoint at url
// (its /metrics, text format), or 0 when the endpoint does not list it.
// series is a metric name with its labels, if it has any, as the endpoint
// writes them: `name{a="x",b="y"}`, labels in name order.
func Value(url, series string) (float64, error) {
	res, err := http.Get(url)
	if err != nil {
		return 0, err
	}
	defer res.Body.Close()
	if res.StatusCode != http.StatusOK {
		return 0, fmt.Errorf("GET %s: %s", url, res.Status)
	}
	sc := bufio.NewScanner(res.Body)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), series+" "); ok {
			f, err := strconv.ParseFloat(v, 64)
			if err != nil {
				return 0, fmt.Errorf("%s: %w", series, err)
			}
			return f, nil
		}
	}
	return 0, sc.Err()
}
