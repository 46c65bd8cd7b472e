package iscsi

import (
	"errors"
	"fmt"
)

// ExitCode is an iscsiadm exit status, the iscsi_err enum of open-iscsi's
// include/iscsi_err.h (the same numbers as the "initiator reported error
// (N - …)" text and iscsiadm(8) EXIT STATUS).
type ExitCode int

// The exit codes of open-iscsi 2.1.x.
const (
	ExitSuccess              ExitCode = 0
	ExitGeneric              ExitCode = 1  // ISCSI_ERR
	ExitSessionNotFound      ExitCode = 2  // ISCSI_ERR_SESS_NOT_FOUND
	ExitNoMemory             ExitCode = 3  // ISCSI_ERR_NOMEM
	ExitTransport            ExitCode = 4  // ISCSI_ERR_TRANS
	ExitLogin                ExitCode = 5  // ISCSI_ERR_LOGIN
	ExitIDBM                 ExitCode = 6  // ISCSI_ERR_IDBM
	ExitInvalid              ExitCode = 7  // ISCSI_ERR_INVAL
	ExitTransportTimeout     ExitCode = 8  // ISCSI_ERR_TRANS_TIMEOUT
	ExitInternal             ExitCode = 9  // ISCSI_ERR_INTERNAL
	ExitLogout               ExitCode = 10 // ISCSI_ERR_LOGOUT
	ExitPDUTimeout           ExitCode = 11 // ISCSI_ERR_PDU_TIMEOUT
	ExitTransportNotFound    ExitCode = 12 // ISCSI_ERR_TRANS_NOT_FOUND
	ExitAccess               ExitCode = 13 // ISCSI_ERR_ACCESS
	ExitTransportCaps        ExitCode = 14 // ISCSI_ERR_TRANS_CAPS
	ExitSessionExists        ExitCode = 15 // ISCSI_ERR_SESS_EXISTS
	ExitInvalidMgmtReq       ExitCode = 16 // ISCSI_ERR_INVALID_MGMT_REQ
	ExitISNSUnavailable      ExitCode = 17 // ISCSI_ERR_ISNS_UNAVAILABLE
	ExitISCSIDComm           ExitCode = 18 // ISCSI_ERR_ISCSID_COMM_ERR
	ExitFatalLogin           ExitCode = 19 // ISCSI_ERR_FATAL_LOGIN
	ExitISCSIDNotConnected   ExitCode = 20 // ISCSI_ERR_ISCSID_NOTCONN
	ExitNoObjects            ExitCode = 21 // ISCSI_ERR_NO_OBJS_FOUND
	ExitSysfsLookup          ExitCode = 22 // ISCSI_ERR_SYSFS_LOOKUP
	ExitHostNotFound         ExitCode = 23 // ISCSI_ERR_HOST_NOT_FOUND
	ExitLoginAuthFailed      ExitCode = 24 // ISCSI_ERR_LOGIN_AUTH_FAILED
	ExitISNSQuery            ExitCode = 25 // ISCSI_ERR_ISNS_QUERY
	ExitISNSRegFailed        ExitCode = 26 // ISCSI_ERR_ISNS_REG_FAILED
	ExitNotSupported         ExitCode = 27 // ISCSI_ERR_OP_NOT_SUPP
	ExitBusy                 ExitCode = 28 // ISCSI_ERR_BUSY
	ExitAgain                ExitCode = 29 // ISCSI_ERR_AGAIN
	ExitUnknownDiscoveryType ExitCode = 30 // ISCSI_ERR_UNKNOWN_DISCOVERY_TYPE
	ExitChildTerminated      ExitCode = 31 // ISCSI_ERR_CHILD_TERMINATED
	ExitSessionNotConnected  ExitCode = 32 // ISCSI_ERR_SESSION_NOT_CONNECTED

	// Exit statuses of a command that could not run, as a shell, nsenter
	// or chroot prefix reports them.
	exitCommandNotExecutable ExitCode = 126
	exitCommandNotFound      ExitCode = 127
)

// exitText is iscsiadm's own description of each code (iscsi_err.c).
var exitText = map[ExitCode]string{
	ExitSuccess:              "success",
	ExitGeneric:              "unknown error",
	ExitSessionNotFound:      "session not found",
	ExitNoMemory:             "no available memory",
	ExitTransport:            "encountered connection failure",
	ExitLogin:                "encountered iSCSI login failure",
	ExitIDBM:                 "encountered iSCSI database failure",
	ExitInvalid:              "invalid parameter",
	ExitTransportTimeout:     "connection timed out",
	ExitInternal:             "internal error",
	ExitLogout:               "encountered iSCSI logout failure",
	ExitPDUTimeout:           "iSCSI PDU timed out",
	ExitTransportNotFound:    "iSCSI driver not found",
	ExitAccess:               "daemon access denied",
	ExitTransportCaps:        "iSCSI driver does not support requested capability",
	ExitSessionExists:        "session exists",
	ExitInvalidMgmtReq:       "Unknown request",
	ExitISNSUnavailable:      "iSNS service not supported",
	ExitISCSIDComm:           "could not communicate to iscsid",
	ExitFatalLogin:           "encountered non-retryable iSCSI login failure",
	ExitISCSIDNotConnected:   "could not connect to iscsid",
	ExitNoObjects:            "no objects found",
	ExitSysfsLookup:          "sysfs lookup failure",
	ExitHostNotFound:         "host not found",
	ExitLoginAuthFailed:      "iSCSI login failed due to authorization failure",
	ExitISNSQuery:            "iSNS query failed",
	ExitISNSRegFailed:        "iSNS registration failed",
	ExitNotSupported:         "operation not supported",
	ExitBusy:                 "device or resource in use",
	ExitAgain:                "operation failed but retry may succeed",
	ExitUnknownDiscoveryType: "unknown discovery type",
	ExitChildTerminated:      "child process terminated",
	ExitSessionNotConnected:  "target likely not connected",
	exitCommandNotFound:      "command not found",
	exitCommandNotExecutable: "command not executable",
}

// String renders "24 (iSCSI login failed due to authorization failure)".
func (c ExitCode) String() string {
	if t, ok := exitText[c]; ok {
		return fmt.Sprintf("%d (%s)", int(c), t)
	}
	return fmt.Sprintf("%d", int(c))
}

// Typed errors a caller branches on with errors.Is. The *CommandError that
// carries them keeps the exit code and the command's (secret-free) output.
var (
	// ErrSessionExists: a session for the node record is already present
	// (15). A login that answers it is not a failure.
	ErrSessionExists = errors.New("session already present")
	// ErrNoObjects: no node record, session or portal matched (21, 2).
	ErrNoObjects = errors.New("no matching node record or session")
	// ErrAuthFailed: the target rejected the login: CHAP or ACL (24).
	ErrAuthFailed = errors.New("login rejected: authorization failure")
	// ErrLoginFatal: a non-retryable login failure, e.g. the target does
	// not know the IQN (19).
	ErrLoginFatal = errors.New("login rejected: non-retryable failure")
	// ErrTimeout: the connection or a PDU timed out (8, 11), or the
	// command's own deadline passed.
	ErrTimeout = errors.New("timed out")
	// ErrUnreachable: the transport failed to connect (4).
	ErrUnreachable = errors.New("portal unreachable")
	// ErrNotConnected: a logout was refused because iscsid has no
	// connection to log out on, typically while it reconnects a session
	// it adopted after a restart (32).
	ErrNotConnected = errors.New("target likely not connected")
	// ErrDaemon: iscsid could not be reached or failed internally (9, 18,
	// 20, 13).
	ErrDaemon = errors.New("iscsid unavailable")
	// ErrBusy: the device or resource is in use (28), or multipath refused
	// to flush an open map.
	ErrBusy = errors.New("in use")
	// ErrCommandNotFound: the command (or the host-entry prefix) is not
	// installed (126, 127, or the executable was not found).
	ErrCommandNotFound = errors.New("command not found")
)

// exitErrors maps exit codes to the typed error they wrap.
var exitErrors = map[ExitCode]error{
	ExitSessionExists:        ErrSessionExists,
	ExitNoObjects:            ErrNoObjects,
	ExitSessionNotFound:      ErrNoObjects,
	ExitLoginAuthFailed:      ErrAuthFailed,
	ExitFatalLogin:           ErrLoginFatal,
	ExitTransportTimeout:     ErrTimeout,
	ExitPDUTimeout:           ErrTimeout,
	ExitTransport:            ErrUnreachable,
	ExitSessionNotConnected:  ErrNotConnected,
	ExitInternal:             ErrDaemon,
	ExitISCSIDComm:           ErrDaemon,
	ExitISCSIDNotConnected:   ErrDaemon,
	ExitAccess:               ErrDaemon,
	ExitBusy:                 ErrBusy,
	exitCommandNotFound:      ErrCommandNotFound,
	exitCommandNotExecutable: ErrCommandNotFound,
}

// CommandError is a failed host command. Its text holds the command line
// with every secret replaced by "***" and the command's output with every
// secret value scrubbed, so it may be logged and returned as is.
type CommandError struct {
	// Command is the redacted command line.
	Command string
	// Code is the exit status; -1 when the command did not exit (killed
	// at its deadline, not started).
	Code ExitCode
	// Output is the scrubbed, trimmed combined output (at most 1 KiB).
	Output string
	// kind is the typed error this one wraps; cause is the underlying
	// error when the command did not exit.
	kind  error
	cause error
}

func (e *CommandError) Error() string {
	var b []byte
	b = fmt.Appendf(b, "%s: ", e.Command)
	switch {
	case e.Code >= 0:
		b = fmt.Appendf(b, "exit %s", e.Code)
	case e.cause != nil:
		b = fmt.Appendf(b, "%v", e.cause)
	default:
		b = append(b, "failed"...)
	}
	if e.Output != "" {
		b = fmt.Appendf(b, ": %s", e.Output)
	}
	return string(b)
}

// Unwrap exposes the typed error and the underlying cause to errors.Is.
func (e *CommandError) Unwrap() []error {
	var errs []error
	if e.kind != nil {
		errs = append(errs, e.kind)
	}
	if e.cause != nil {
		errs = append(errs, e.cause)
	}
	return errs
}

// Exit returns the exit code of a *CommandError in err's chain; ok is
// false when err holds none or the command did not exit.
func Exit(err error) (code ExitCode, ok bool) {
	var ce *CommandError
	if errors.As(err, &ce) && ce.Code >= 0 {
		return ce.Code, true
	}
	return 0, false
}
