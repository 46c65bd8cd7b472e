package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"text/tabwriter"
	"time"

	mount "k8s.io/mount-utils"

	"github.com/pathmend/pathmend/pkg/blockuse"
	"github.com/pathmend/pathmend/pkg/driver"
	"github.com/pathmend/pathmend/pkg/fshealth"
	"github.com/pathmend/pathmend/pkg/heal"
	"github.com/pathmend/pathmend/pkg/iscsi"
	"github.com/pathmend/pathmend/pkg/nvme"
	"github.com/pathmend/pathmend/pkg/sysfs"
	"github.com/pathmend/pathmend/pkg/volume"
)

// diagnoseSchemaVersion is the schemaVersion of `pathmend diagnose --json`
// (docs/diagnose.md). A change that breaks a reader of the previous
// version must bump it.
const diagnoseSchemaVersion = 1

// Exit statuses of `pathmend diagnose`.
const (
	diagnoseHealthy = 0
	diagnoseDefects = 1
	diagnoseError   = 2
)

func diagnoseCommand() *command {
	return &command{
		name:    "diagnose",
		summary: "Report the node's NVMe and iSCSI paths and defects, read-only",
		synopsis: []string{
			"diagnose [--sys-root DIR] [--state-dir DIR] [--mountinfo FILE] [--json]",
			"diagnose --plan [--heal-grace D] [--heal-max-scope S] [--heal-iscsi-scope S] [--iscsi-stuck-threshold D] [...]",
		},
		description: `Read the node's NVMe and iSCSI state from sysfs once and print it: NVMe
subsystems, controllers, namespaces and ANA legs; iSCSI sessions, LUNs, disks
and multipath maps; the staged volumes; and every defect the monitor would
see, a staged volume whose mount is on a device the kernel replaced and a
staged filesystem that is read-only after errors, shut down or recording
errors included. --plan adds what the heal policy would do right now, as a dry run.
diagnose only reads: it writes nothing, connects nothing and starts no
process, so it is safe on a production node. The JSON schema is in
docs/diagnose.md.`,
		groups: []flagGroup{
			{"Report flags", []string{"sys-root", "state-dir", "mountinfo", "proc-root", "json"}},
			{"Plan flags (a dry run: no action, ever)", []string{"plan", "heal-grace", "heal-max-scope", "heal-iscsi-scope", "iscsi-stuck-threshold"}},
		},
		exitCodes: []exitCode{
			{diagnoseHealthy, "healthy: no defect"},
			{diagnoseDefects, "at least one defect; the report lists them"},
			{diagnoseError, "error: bad usage, --sys-root missing or not a sysfs tree (no class/ or devices/), an unreadable attribute or staged-volume record; nothing on stdout"},
		},
		run: func(c *command, args []string, stdout, stderr io.Writer) int {
			return diagnose(args, stdout, stderr, time.Now)
		},
	}
}

// diagnose is `pathmend diagnose`: one read of sysfs (NVMe and iSCSI),
// the diagnosis of each, and a report. It reads only; it writes nothing
// and starts no process. now is the clock ages are relative to. Flags
// are parsed into locals: there is no state to share with serve.
func diagnose(args []string, stdout, stderr io.Writer, now func() time.Time) int {
	c := diagnoseCommand()
	fl := c.newFlagSet()
	sysRoot := fl.String("sys-root", "/sys", "root of the sysfs tree to read; must hold class/ and devices/")
	stateDir := fl.String("state-dir", "/var/lib/pathmend", "directory of the staged-volume records (empty: none)")
	procRoot := fl.String("proc-root", "/proc", "procfs root ext4's options are read under, for the health of staged filesystems")
	mountInfo := fl.String("mountinfo", "/proc/self/mountinfo", "mount table with device numbers, to tell whether staged volumes are still on their devices and, with --plan, whether an iSCSI LUN is in use (from a container: the host's, /proc/1/mountinfo; empty: do not check, every LUN of a target no staged volume uses counts as in use)")
	asJSON := fl.Bool("json", false, "print the report as JSON (docs/diagnose.md)")
	plan := fl.Bool("plan", false, "also show what the heal policy would do right now (a dry run: no action, ever)")
	grace := fl.Duration("heal-grace", heal.DefaultGrace, "with --plan: the connect grace the policy applies")
	maxScope := fl.String("heal-max-scope", "subsystem", "with --plan: the widest teardown allowed (controller or subsystem)")
	iscsiScope := fl.String("heal-iscsi-scope", string(iscsi.HealStaged), "with --plan: iSCSI sessions the heal may kick (staged, all, or foreign as companion mode does)")
	iscsiThreshold := fl.Duration("iscsi-stuck-threshold", iscsi.DefaultThreshold, "with --plan: how long a session must be down, its portal reachable, before the heal kicks it")
	if code, done := c.parse(fl, args, stdout, stderr); done {
		if code != 0 {
			return diagnoseError
		}
		return diagnoseHealthy
	}
	sys := sysfs.New(*sysRoot)
	if err := sys.CheckRoot(); err != nil {
		fmt.Fprintf(stderr, "pathmend diagnose: --sys-root: %v\n", err)
		return diagnoseError
	}
	h, err := nvme.Read(sys)
	if err != nil {
		fmt.Fprintf(stderr, "pathmend diagnose: %v\n", err)
		return diagnoseError
	}
	snap, err := iscsi.Read(sys, now())
	if err != nil {
		fmt.Fprintf(stderr, "pathmend diagnose: %v\n", err)
		return diagnoseError
	}
	listing, err := stagedRecords(*stateDir)
	if err != nil {
		fmt.Fprintf(stderr, "pathmend diagnose: %v\n", err)
		return diagnoseError
	}
	records := listing.Records
	learned, err := readLearned(*stateDir)
	if err != nil {
		fmt.Fprintf(stderr, "pathmend diagnose: learned subsystems: %v\n", err)
		return diagnoseError
	}
	// iSCSI records yield no expectation; their paths are not NVMe's.
	var want []nvme.Expectation
	for _, r := range records {
		if e, ok := nvme.ExpectationFromRecord(r); ok {
			want = append(want, e)
		}
	}
	nvmeDefects := nvme.Inspect(h, want)
	rep := newReport(h, want, nvmeDefects, now())
	rep.SysRoot, rep.StateDir = *sysRoot, *stateDir
	rep.addRecords(listing)
	// iSCSI defects follow the NVMe ones; the NVMe policy plans only its
	// own, the iSCSI plan is the session heal's structural choice.
	pcfg := iscsiPlanConfig{Scope: iscsi.HealScope(*iscsiScope), Threshold: *iscsiThreshold}
	if *mountInfo != "" {
		pcfg.Use = blockuse.New(sys, blockuse.MountInfoFile(*mountInfo))
	}
	isd := diagnoseISCSI(snap, records, pcfg)
	rep.ISCSI = isd.rep
	rep.Defects = append(rep.Defects, isd.defects...)
	var stagedPlan []planRep
	if *mountInfo != "" {
		infos, err := mount.ParseMountInfo(*mountInfo)
		if err != nil {
			fmt.Fprintf(stderr, "pathmend diagnose: --mountinfo: %v\n", err)
			return diagnoseError
		}
		var staged []heal.Defect
		staged, stagedPlan = stagedDeviceDefects(context.Background(), sys, h, snap, records, driver.MountsOf(infos))
		rep.Defects = append(rep.Defects, staged...)
		fsDefects, fsPlan := filesystemDefects(fshealth.New(sys, *procRoot, nil), records, infos)
		rep.Defects = append(rep.Defects, fsDefects...)
		stagedPlan = append(stagedPlan, fsPlan...)
	}
	rep.Healthy = len(rep.Defects) == 0 && len(rep.Unreadable) == 0
	rep.addLearned(learned)
	if *plan {
		if s := iscsi.HealScope(*iscsiScope); s != iscsi.HealStaged && s != iscsi.HealAll && s != iscsi.HealForeign {
			fmt.Fprintf(stderr, "pathmend diagnose: --heal-iscsi-scope %q: want staged, all or foreign\n", s)
			return diagnoseError
		}
		if *iscsiThreshold <= 0 {
			fmt.Fprintln(stderr, "pathmend diagnose: --iscsi-stuck-threshold must be positive")
			return diagnoseError
		}
		scope, err := parseScope(*maxScope)
		if err != nil {
			fmt.Fprintf(stderr, "pathmend diagnose: --heal-max-scope: %v\n", err)
			return diagnoseError
		}
		p, err := heal.NewPolicy(heal.Config{Mode: heal.ModeRepair, Grace: *grace, MaxScope: scope, Now: now})
		if err != nil {
			fmt.Fprintf(stderr, "pathmend diagnose: %v\n", err)
			return diagnoseError
		}
		rep.Plan = append(append(companionPlan(h, nvmeDefects, learned, listing, p), isd.plan...), stagedPlan...)
	}
	if *asJSON {
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		err = enc.Encode(rep)
	} else {
		err = rep.writeTable(stdout)
	}
	if err != nil {
		fmt.Fprintf(stderr, "pathmend diagnose: write report: %v\n", err)
		return diagnoseError
	}
	if !rep.Healthy {
		return diagnoseDefects
	}
	return diagnoseHealthy
}

// stagedRecords lists the records under dir without creating anything: a
// missing state directory, or one without the records subdirectory the
// store keeps them in (<dir>/volumes), is a node with no staged volume. A
// record that cannot be read is in the listing, not an error.
func stagedRecords(dir string) (volume.Listing, error) {
	if dir == "" {
		return volume.Listing{}, nil
	}
	abs, err := filepath.Abs(dir)
	if err != nil {
		return volume.Listing{}, err
	}
	if _, err := os.Stat(filepath.Join(abs, "volumes")); errors.Is(err, fs.ErrNotExist) {
		return volume.Listing{}, nil
	}
	store, err := volume.NewStore(abs)
	if err != nil {
		return volume.Listing{}, err
	}
	return store.Scan()
}

// unreadableRep is a record file that cannot be read: nothing of the
// target it may belong to is torn down until it is readable or removed.
type unreadableRep struct {
	File     string `json:"file"`
	VolumeID string `json:"volumeID,omitempty"`
	// Target is "nvme-tcp <nqn>" or "iscsi <iqn>"; empty when the file
	// names none (then it blocks teardown on every target).
	Target string `json:"target,omitempty"`
	Error  string `json:"error"`
}

// addRecords adds what the records say beyond the volumes: the files
// that cannot be read, and the state of volumes whose stage or unstage
// was interrupted.
func (r *report) addRecords(l volume.Listing) {
	for _, u := range l.Unreadable {
		ur := unreadableRep{File: u.Path, VolumeID: u.VolumeID, Error: u.Err.Error()}
		if !u.Target.IsZero() {
			ur.Target = u.Target.String()
		}
		r.Unreadable = append(r.Unreadable, ur)
	}
	states := map[string]volume.State{}
	for _, rec := range l.Records {
		if rec.State != volume.StateStaged {
			states[rec.VolumeID] = rec.State
		}
	}
	for i := range r.Volumes {
		r.Volumes[i].State = states[r.Volumes[i].VolumeID]
	}
}

// report is the document `pathmend diagnose --json` prints; the field
// names and their meaning are the versioned schema of docs/diagnose.md,
// so a change here is a change there (and maybe of the schemaVersion).
type report struct {
	SchemaVersion int           `json:"schemaVersion"`
	Time          time.Time     `json:"time"`
	SysRoot       string        `json:"sysRoot"`
	StateDir      string        `json:"stateDir"`
	Healthy       bool          `json:"healthy"`
	Subsystems    []subsysRep   `json:"subsystems"`
	Orphans       []ctrlRep     `json:"unlistedControllers"`
	Volumes       []volumeRep   `json:"volumes"`
	Defects       []heal.Defect `json:"defects"`
	Skipped       []nvme.Skip   `json:"skipped"`
	// ISCSI is the iSCSI sessions, multipath maps and staged iSCSI
	// volumes (diagnose_iscsi.go); its defects are in Defects.
	ISCSI iscsiRep `json:"iscsi"`
	// Unreadable are the record files that cannot be read (absent when
	// there is none); the node is then not healthy.
	Unreadable []unreadableRep `json:"unreadableRecords,omitempty"`
	// Plan is present with --plan only (an empty list without defects:
	// omitzero drops nil, not empty): the verdict on each defect right
	// now, as a dry run.
	Plan []planRep `json:"plan,omitzero"`
	// Learned are the NVMe endpoints companion mode learned (absent when
	// it learned none); UnreadableLearned its files that cannot be read
	// (the node is then not healthy).
	Learned           []learnedRep    `json:"learned,omitempty"`
	UnreadableLearned []unreadableRep `json:"unreadableLearned,omitempty"`
}

// planRep is the dry-run verdict on one defect.
type planRep struct {
	Kind    heal.Kind    `json:"kind"`
	Scope   heal.Scope   `json:"scope"`
	Key     string       `json:"key"`
	Verdict heal.Verdict `json:"verdict"` // observed = would repair
	Reason  string       `json:"reason"`
}

func planOf(outs []heal.Outcome) []planRep {
	plan := []planRep{}
	for _, o := range outs {
		plan = append(plan, planRep{Kind: o.Defect.Kind, Scope: o.Defect.Scope, Key: o.Defect.Key, Verdict: o.Verdict, Reason: o.Reason})
	}
	return plan
}

// subsysRep is one kernel subsystem instance with what it holds.
type subsysRep struct {
	Name        nvme.SubsystemName `json:"name"`
	NQN         string             `json:"nqn"`
	Model       string             `json:"model"`
	Serial      string             `json:"serial"`
	IOPolicy    string             `json:"iopolicy"`
	Type        string             `json:"type"`
	Controllers []ctrlRep          `json:"controllers"`
	Namespaces  []nsRep            `json:"namespaces"`
}

// ctrlRep is one controller. CreatedAt and AgeSeconds are null when the
// age is unknown; timeouts print as the kernel does ("off" or seconds).
type ctrlRep struct {
	Name           nvme.ControllerName  `json:"name"`
	State          nvme.ControllerState `json:"state"`
	Transport      string               `json:"transport"`
	Endpoint       string               `json:"endpoint"`
	Address        string               `json:"address"`
	CntlID         uint16               `json:"cntlid"`
	CreatedAt      *time.Time           `json:"createdAt"`
	AgeSeconds     *float64             `json:"ageSeconds"`
	CtrlLossTmo    string               `json:"ctrlLossTmo"`
	ReconnectDelay string               `json:"reconnectDelay"`
	FastIOFailTmo  string               `json:"fastIOFailTmo"`
	KATO           int                  `json:"kato"`
	Legs           []pathRep            `json:"legs"`
}

// nsRep is one namespace with its block devices and the staged volumes
// whose identity it matches.
type nsRep struct {
	NSID      uint32            `json:"nsid"`
	Devices   []nvme.DeviceName `json:"devices"`
	NGUID     string            `json:"nguid"`
	UUID      string            `json:"uuid"`
	WWID      string            `json:"wwid"`
	SizeBytes uint64            `json:"sizeBytes"`
	Paths     []pathRep         `json:"paths"`
	Volumes   []string          `json:"volumes"`
}

// pathRep is one leg: in a controller's legs and in a namespace's paths.
type pathRep struct {
	Controller nvme.ControllerName `json:"controller"`
	Device     nvme.DeviceName     `json:"device"`
	NSID       uint32              `json:"nsid"`
	ANAState   nvme.ANAState       `json:"anaState"` // "" without ANA
	ANAGroup   uint32              `json:"anaGroup"` // 0 without ANA
}

// volumeRep is one staged NVMe/TCP volume and the devices found for it.
type volumeRep struct {
	VolumeID string `json:"volumeID"`
	// State is the record's state when it is not staged (attaching,
	// detaching: an interrupted stage or unstage); absent when staged.
	State   volume.State      `json:"state,omitempty"`
	NQN     string            `json:"nqn"`
	NSID    uint32            `json:"nsid,omitempty"`
	NGUID   string            `json:"nguid,omitempty"`
	UUID    string            `json:"uuid,omitempty"`
	Devices []nvme.DeviceName `json:"devices"`
}

// newReport turns one read and its diagnosis into a report. Lists are
// never null in JSON, so a reader can iterate without checks.
func newReport(h *nvme.Host, want []nvme.Expectation, defects []heal.Defect, now time.Time) *report {
	rep := &report{
		SchemaVersion: diagnoseSchemaVersion, Time: now, Healthy: len(defects) == 0,
		Subsystems: []subsysRep{}, Orphans: []ctrlRep{}, Volumes: []volumeRep{},
		Defects: nonNil(defects), Skipped: nonNil(h.Skipped),
	}
	legs := map[nvme.ControllerName][]pathRep{}
	for _, s := range h.Subsystems {
		for _, ns := range s.Namespaces {
			for _, p := range ns.Paths {
				legs[p.Controller] = append(legs[p.Controller], pathRep{p.Controller, p.Device, ns.NSID, p.ANAState, p.ANAGroup})
			}
		}
	}
	for _, c := range h.Controllers {
		if c.Subsystem == "" {
			rep.Orphans = append(rep.Orphans, newCtrlRep(c, legs[c.Name], now))
		}
	}
	for _, e := range want {
		rep.Volumes = append(rep.Volumes, volumeRep{VolumeID: e.VolumeID, NQN: e.NQN, NSID: e.NSID, NGUID: e.NGUID, UUID: e.UUID, Devices: []nvme.DeviceName{}})
	}
	for _, s := range h.Subsystems {
		sr := subsysRep{Name: s.Name, NQN: s.NQN, Model: s.Model, Serial: s.Serial, IOPolicy: s.IOPolicy, Type: s.Type,
			Controllers: []ctrlRep{}, Namespaces: []nsRep{}}
		for _, name := range s.Controllers {
			if c, ok := h.Controller(name); ok {
				sr.Controllers = append(sr.Controllers, newCtrlRep(*c, legs[name], now))
			}
		}
		for _, ns := range s.Namespaces {
			nr := nsRep{NSID: ns.NSID, Devices: ns.Devices(), NGUID: ns.NGUID, UUID: ns.UUID, WWID: ns.WWID,
				SizeBytes: ns.Sectors * 512, Paths: []pathRep{}, Volumes: []string{}}
			for _, p := range ns.Paths {
				nr.Paths = append(nr.Paths, pathRep{p.Controller, p.Device, ns.NSID, p.ANAState, p.ANAGroup})
			}
			for i, e := range want {
				if e.NQN == s.NQN && e.Matches(&ns) {
					nr.Volumes = append(nr.Volumes, e.VolumeID)
					rep.Volumes[i].Devices = append(rep.Volumes[i].Devices, nr.Devices...)
				}
			}
			sr.Namespaces = append(sr.Namespaces, nr)
		}
		rep.Subsystems = append(rep.Subsystems, sr)
	}
	return rep
}

// newCtrlRep reports one controller; its age is unknown (null) when the
// read could not tell when the kernel created it.
func newCtrlRep(c nvme.Controller, legs []pathRep, now time.Time) ctrlRep {
	r := ctrlRep{
		Name: c.Name, State: c.State, Transport: c.Transport, Endpoint: c.EndpointText(),
		Address: c.RawAddress, CntlID: c.CntlID, KATO: c.KATO, Legs: nonNil(legs),
		CtrlLossTmo: c.CtrlLossTmo.String(), ReconnectDelay: c.ReconnectDelay.String(), FastIOFailTmo: c.FastIOFailTmo.String(),
	}
	if !c.CreatedAt.IsZero() {
		created, age := c.CreatedAt, now.Sub(c.CreatedAt).Seconds()
		r.CreatedAt, r.AgeSeconds = &created, &age
	}
	return r
}

// nonNil keeps empty lists "[]" in JSON.
func nonNil[T any](s []T) []T {
	if s == nil {
		return []T{}
	}
	return s
}

// writeTable prints the report for a terminal: per subsystem a table of
// its controllers and one of its namespaces, then the staged volumes, then
// the defects with their teardown plans.
func (r *report) writeTable(out io.Writer) error {
	w := &stickyWriter{w: out}
	for _, s := range r.Subsystems {
		fmt.Fprintf(w, "%s  %s  iopolicy %s  model %s\n", s.Name, s.NQN, dash(s.IOPolicy), dash(s.Model))
		writeRows(w, ctrlRows(s.Controllers))
		if len(s.Namespaces) == 0 {
			fmt.Fprintln(w, "  (no namespace)")
		}
		rows := [][]string{{"NSID", "DEVICES", "SIZE", "WWID", "PATHS", "VOLUMES"}}
		for _, ns := range s.Namespaces {
			var paths []string
			for _, p := range ns.Paths {
				paths = append(paths, string(p.Controller)+" "+dash(string(p.ANAState)))
			}
			rows = append(rows, []string{fmt.Sprint(ns.NSID), joinNames(ns.Devices), sizeString(ns.SizeBytes),
				dash(ns.WWID), dash(strings.Join(paths, ", ")), dash(strings.Join(ns.Volumes, ", "))})
		}
		if len(rows) > 1 {
			writeRows(w, rows)
		}
		fmt.Fprintln(w)
	}
	if len(r.Orphans) > 0 {
		fmt.Fprintln(w, "controllers no subsystem lists")
		writeRows(w, ctrlRows(r.Orphans))
		fmt.Fprintln(w)
	}
	if len(r.Volumes) > 0 {
		rows := [][]string{{"VOLUME", "NQN", "DEVICES"}}
		for _, v := range r.Volumes {
			id := v.VolumeID
			if v.State != "" {
				id += " (" + string(v.State) + ")"
			}
			rows = append(rows, []string{id, v.NQN, dash(joinNames(v.Devices))})
		}
		writeRows(w, rows)
		fmt.Fprintln(w)
	}
	if len(r.Unreadable) > 0 {
		fmt.Fprintf(w, "%d staged-volume record(s) cannot be read; nothing of their targets is torn down until each is readable or removed (docs/state.md):\n", len(r.Unreadable))
		rows := [][]string{{"FILE", "VOLUME", "TARGET", "ERROR"}}
		for _, u := range r.Unreadable {
			tgt := u.Target
			if tgt == "" {
				tgt = "unknown: blocks every target"
			}
			rows = append(rows, []string{u.File, dash(u.VolumeID), tgt, u.Error})
		}
		writeRows(w, rows)
		fmt.Fprintln(w)
	}
	r.writeLearned(w)
	r.ISCSI.writeTable(w)
	for _, s := range r.Skipped {
		fmt.Fprintf(w, "skipped %s: %s\n", s.Path, s.Reason)
	}
	if len(r.Defects) == 0 {
		fmt.Fprintln(w, "No defects.")
		return w.err
	}
	fmt.Fprintf(w, "%d defect(s):\n", len(r.Defects))
	for i, d := range r.Defects {
		fmt.Fprintf(w, "%d. %s (%s scope) %s\n   key: %s\n   %s\n", i+1, d.Kind, d.Scope, d.Subject, d.Key, d.Detail)
		for j, p := range d.Teardown {
			fmt.Fprintf(w, "   teardown %d: %s %s, %s, access %s\n", j+1, p.Name, p.Endpoint, p.State, dash(p.Access))
		}
		for _, c := range d.CoTenants {
			fmt.Fprintf(w, "   co-tenant: %s (%s)\n", c.Namespace, c.Device)
		}
		if len(d.Volumes) > 0 {
			fmt.Fprintf(w, "   volumes: %s\n", strings.Join(d.Volumes, ", "))
		}
	}
	if r.Plan != nil {
		fmt.Fprintln(w, "Plan (dry run, nothing is done):")
		for _, p := range r.Plan {
			verdict := string(p.Verdict)
			if p.Verdict == heal.Observed {
				verdict = "would repair"
			}
			fmt.Fprintf(w, "   %s %s: %s — %s\n", p.Kind, p.Key, verdict, p.Reason)
		}
	}
	return w.err
}

// ctrlRows is the controller table, header first.
func ctrlRows(cs []ctrlRep) [][]string {
	rows := [][]string{{"CONTROLLER", "STATE", "ENDPOINT", "CNTLID", "AGE", "LEGS"}}
	for _, c := range cs {
		age := "?"
		if c.AgeSeconds != nil {
			age = time.Duration(*c.AgeSeconds * float64(time.Second)).Round(time.Second).String()
		}
		var legs []string
		for _, l := range c.Legs {
			legs = append(legs, string(l.Device)+" "+dash(string(l.ANAState)))
		}
		rows = append(rows, []string{string(c.Name), string(c.State), c.Endpoint, fmt.Sprint(c.CntlID), age, dash(strings.Join(legs, ", "))})
	}
	return rows
}

// writeRows prints rows as an indented table with aligned columns.
func writeRows(w io.Writer, rows [][]string) {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	for _, r := range rows {
		fmt.Fprintln(tw, "  "+strings.Join(r, "\t"))
	}
	tw.Flush()
}

// stickyWriter remembers the first write error, so a report is written
// without checking every Fprintf.
type stickyWriter struct {
	w   io.Writer
	err error
}

// Write writes p unless an earlier write failed.
func (s *stickyWriter) Write(p []byte) (int, error) {
	if s.err != nil {
		return 0, s.err
	}
	n, err := s.w.Write(p)
	s.err = err
	return n, err
}

// joinNames renders device names "nvme0n1,nvme1n1".
func joinNames(ds []nvme.DeviceName) string {
	s := make([]string, len(ds))
	for i, d := range ds {
		s[i] = string(d)
	}
	return strings.Join(s, ",")
}

// dash stands in for an empty table cell.
func dash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

// sizeString renders bytes in binary units: "64 MiB".
func sizeString(b uint64) string {
	units := []string{"B", "KiB", "MiB", "GiB", "TiB", "PiB"}
	i := 0
	for v := b; v >= 1024 && i < len(units)-1 && v%1024 == 0; v /= 1024 {
		i++
	}
	return fmt.Sprintf("%d %s", b>>(10*i), units[i])
}
