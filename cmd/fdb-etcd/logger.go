package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"slices"

	"go.etcd.io/etcd/client/pkg/v3/logutil"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"gopkg.in/natefinch/lumberjack.v2"
)

// etcd's --log-outputs values that are not file paths.
const (
	logOutputDefault = "default"
	logOutputJournal = "systemd/journal"
	logOutputStderr  = "stderr"
	logOutputStdout  = "stdout"
)

var errLogRotationOutput = errors.New("--log-outputs requires a single file path when --log-rotate-config-json is defined")

// newLogger builds the logger etcd 3.6 builds from --logger, --log-level,
// --log-format, --log-outputs, --enable-log-rotation and
// --log-rotation-config-json (embed/config_logging.go), with etcd's
// encoder, so that tools reading etcd's log read this one. Unlike etcd it
// does not sample: the slow-request warnings must all be written. The
// returned function closes the files it opened.
func newLogger(c *etcdConfig) (*zap.Logger, func(), error) {
	switch c.Logger {
	case "zap":
	case "capnslog":
		return nil, nil, errors.New("--logger=capnslog is removed in v3.5")
	default:
		return nil, nil, fmt.Errorf("unknown logger option %q", c.Logger)
	}
	var lvl zapcore.Level
	if err := lvl.Set(c.LogLevel); err != nil {
		return nil, nil, fmt.Errorf("--log-level: %w", err)
	}
	format, err := logutil.ConvertToZapFormat(c.LogFormat)
	if err != nil {
		return nil, nil, err
	}
	outputs := c.LogOutputs
	if len(outputs) == 0 {
		outputs = []string{logOutputDefault}
	}
	if len(outputs) > 1 && slices.Contains(outputs, logOutputDefault) {
		return nil, nil, fmt.Errorf("multi logoutput for %q is not supported yet", logOutputDefault)
	}
	ws, closeAll, err := logSinks(outputs, c.EnableLogRotation, c.LogRotationConfigJSON)
	if err != nil {
		return nil, nil, err
	}
	enc := zapcore.NewJSONEncoder(logutil.DefaultZapLoggerConfig.EncoderConfig)
	if format == logutil.ConsoleLogFormat {
		enc = zapcore.NewConsoleEncoder(logutil.DefaultZapLoggerConfig.EncoderConfig)
	}
	core := zapcore.NewCore(enc, ws, zap.NewAtomicLevelAt(lvl))
	return zap.New(core, zap.AddCaller(), zap.AddStacktrace(zapcore.ErrorLevel), zap.ErrorOutput(ws)), closeAll, nil
}

// logSinks opens the outputs: stderr (also for "default"), stdout, the
// systemd journal, or files appended to, one of them rotated with
// --enable-log-rotation.
func logSinks(outputs []string, rotate bool, rotation string) (zapcore.WriteSyncer, func(), error) {
	var rot *lumberjack.Logger
	if rotate {
		var err error
		if rot, err = logRotation(outputs, rotation); err != nil {
			return nil, nil, err
		}
	}
	if slices.Contains(outputs, logOutputJournal) {
		return journalSink(outputs)
	}
	var sinks []zapcore.WriteSyncer
	var files []*os.File
	closeAll := func() {
		for _, f := range files {
			_ = f.Close()
		}
		if rot != nil {
			_ = rot.Close()
		}
	}
	slices.Sort(outputs)
	for _, o := range slices.Compact(slices.Clone(outputs)) {
		switch o {
		case logOutputDefault, logOutputStderr:
			sinks = append(sinks, zapcore.Lock(os.Stderr))
		case logOutputStdout:
			sinks = append(sinks, zapcore.Lock(os.Stdout))
		default:
			if rot != nil {
				rot.Filename = o
				sinks = append(sinks, zapcore.AddSync(rot))
				continue
			}
			f, err := os.OpenFile(o, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o666)
			if err != nil {
				closeAll()
				return nil, nil, fmt.Errorf("--log-outputs: %w", err)
			}
			files = append(files, f)
			sinks = append(sinks, zapcore.Lock(f))
		}
	}
	return zapcore.NewMultiWriteSyncer(sinks...), closeAll, nil
}

// journalSink writes to systemd's journal, which etcd allows only beside
// "default".
func journalSink(outputs []string) (zapcore.WriteSyncer, func(), error) {
	if len(outputs) > 1 {
		for _, o := range outputs {
			if o != logOutputDefault {
				return nil, nil, fmt.Errorf("running with systemd/journal but other '--log-outputs' values (%q) are configured with 'default'; override 'default' value with something else", outputs)
			}
		}
	}
	jw, err := logutil.NewJournalWriter(os.Stderr)
	if err != nil {
		return nil, nil, fmt.Errorf("can't find journal (%w)", err)
	}
	return zapcore.AddSync(jw), func() {}, nil
}

// logRotation checks that at most one output is a file (and that a single
// output is one), and reads
// --log-rotation-config-json, with etcd's errors.
func logRotation(outputs []string, config string) (*lumberjack.Logger, error) {
	files := 0
	for _, o := range outputs {
		switch o {
		case logOutputDefault, logOutputStderr, logOutputStdout:
		default:
			files++
		}
	}
	if (len(outputs) == 1 && files == 0) || files > 1 {
		return nil, errLogRotationOutput
	}
	var l lumberjack.Logger
	if err := json.Unmarshal([]byte(config), &l); err != nil {
		var typeErr *json.UnmarshalTypeError
		var syntaxErr *json.SyntaxError
		switch {
		case errors.As(err, &syntaxErr):
			return nil, fmt.Errorf("improperly formatted log rotation config: %w", err)
		case errors.As(err, &typeErr):
			return nil, fmt.Errorf("invalid log rotation config: %w", err)
		default:
			return nil, fmt.Errorf("fail to unmarshal log rotation config: %w", err)
		}
	}
	return &l, nil
}
