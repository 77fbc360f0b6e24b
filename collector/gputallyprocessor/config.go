// Copyright gputally authors
// SPDX-License-Identifier: Apache-2.0

package gputallyprocessor // import "github.com/gputally/gputally/collector/gputallyprocessor"

import (
	"errors"
	"fmt"
	"time"

	"go.opentelemetry.io/collector/config/configgrpc"
	"go.opentelemetry.io/collector/confmap"
)

// OnError says what becomes of a batch whose call to gputally failed.
type OnError string

const (
	// OnErrorPass sends the batch on unchanged (unattributed) and counts its items.
	OnErrorPass OnError = "pass"
	// OnErrorDrop drops the batch and counts its items; upstream sees success.
	OnErrorDrop OnError = "drop"
	// OnErrorFail returns the error upstream, permanent or retryable by the call's gRPC code,
	// so that a sender or an exporter queue before this pipeline keeps and retries the batch.
	OnErrorFail OnError = "fail"
)

// maxConnections bounds `connections`: a pool, not a connection per call.
const maxConnections = 16

// maxMessageSizeMiB is the largest max_message_size_mib: a protobuf message is below 2 GiB.
const maxMessageSizeMiB = 2047

// Config is the `gputally` processor's configuration.
type Config struct {
	// ClientConfig holds the gRPC client settings of the connection to gputally's bridge,
	// the same keys as the otlp exporter's: endpoint, tls, auth, headers, compression,
	// keepalive, balancer_name, authority, wait_for_ready, read/write buffer sizes.
	ClientConfig configgrpc.ClientConfig `mapstructure:",squash"`

	// Pipeline is the id of the gputally pipeline that processes the batches, e.g.
	// "metrics/bridge". Required.
	Pipeline string `mapstructure:"pipeline"`

	// Timeout bounds each call to gputally (the caller's own deadline applies if earlier).
	Timeout time.Duration `mapstructure:"timeout"`

	// OnError is what becomes of a batch when the call fails: pass (default), drop or fail.
	OnError OnError `mapstructure:"on_error"`

	// AcceptPatch asks gputally to answer with what its pipeline changed (a patch, applied to
	// the batch in place) rather than the whole batch when its pipeline only annotates.
	// false: always the whole batch, decoded anew, as from servers that predate patches.
	AcceptPatch bool `mapstructure:"accept_patch"`

	// Connections is how many gRPC connections the processor ID opens to gputally, calls
	// spread round robin over them: as many as gputally's `serve --workers`, whose processes
	// share the port by connection. 1 to 16.
	Connections int `mapstructure:"connections"`

	// MaxMessageSizeMiB caps a request and a response, in MiB, in place of gRPC's 4 MiB
	// default for received messages. gputally's bridge server must accept as much.
	MaxMessageSizeMiB int `mapstructure:"max_message_size_mib"`

	// prevent unkeyed literal initialization
	_ struct{}
}

var _ confmap.Validator = (*Config)(nil)

// Validate reports every problem of the processor's own keys at once. The gRPC client keys
// (endpoint syntax, balancer_name, tls...) are checked by configgrpc's own Validate, which
// the Collector calls for the embedded settings.
func (cfg *Config) Validate() error {
	var errs []error
	if cfg.ClientConfig.Endpoint == "" {
		errs = append(errs, errors.New(`endpoint: required (gputally's bridge address, e.g. "localhost:4320")`))
	}
	if cfg.Pipeline == "" {
		errs = append(errs, errors.New(`pipeline: required (the gputally pipeline id, e.g. "metrics/bridge")`))
	}
	if cfg.Timeout <= 0 {
		errs = append(errs, fmt.Errorf("timeout: must be positive, got %v", cfg.Timeout))
	}
	switch cfg.OnError {
	case OnErrorPass, OnErrorDrop, OnErrorFail:
	default:
		errs = append(errs, fmt.Errorf("on_error: must be pass, drop or fail, got %q", cfg.OnError))
	}
	if cfg.Connections < 1 || cfg.Connections > maxConnections {
		errs = append(errs, fmt.Errorf("connections: must be 1 to %d, got %d", maxConnections, cfg.Connections))
	}
	if cfg.MaxMessageSizeMiB < 1 || cfg.MaxMessageSizeMiB > maxMessageSizeMiB {
		errs = append(errs, fmt.Errorf("max_message_size_mib: must be 1 to %d, got %d", maxMessageSizeMiB, cfg.MaxMessageSizeMiB))
	}
	return errors.Join(errs...)
}

// maxMessageBytes is MaxMessageSizeMiB in bytes, for gRPC's call options.
func (cfg *Config) maxMessageBytes() int {
	return cfg.MaxMessageSizeMiB << 20
}
