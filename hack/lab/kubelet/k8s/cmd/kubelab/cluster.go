package main

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/yaml"
)

// createObjects creates what the volumes need: the CSIDriver of
// deploy/base, the default ServiceAccount (no controller creates it
// here), the node-stage secrets, and each PVC and PV pre-bound: the PVC
// names the PV, the PV's claimRef carries the PVC's UID, and both
// statuses are set to Bound through the API — what the PV controller
// would write. kubelet refuses a claim whose status is not Bound and a
// PV whose claimRef UID is not the claim's.
func (l *Lab) createObjects(vols []Volume) error {
	ctx, cancel := l.ctx()
	defer cancel()
	drv, err := csiDriver(filepath.Join(l.share, "deploy", "base", "csidriver.yaml"))
	if err != nil {
		return err
	}
	if _, err := l.cs.StorageV1().CSIDrivers().Create(ctx, drv, metav1.CreateOptions{}); err != nil {
		return err
	}
	if _, err := l.cs.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: secretNamespace}}, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		return err
	}
	if _, err := l.cs.CoreV1().ServiceAccounts(workloadNamespace).Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "default"}}, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		return err
	}
	for _, v := range vols {
		if v.Secret != nil {
			if _, err := l.cs.CoreV1().Secrets(v.Secret.Namespace).Create(ctx, v.Secret, metav1.CreateOptions{}); err != nil {
				return err
			}
		}
		pvc, err := l.cs.CoreV1().PersistentVolumeClaims(workloadNamespace).Create(ctx, v.PVC(), metav1.CreateOptions{})
		if err != nil {
			return err
		}
		pv, err := v.PV(filepath.Join(l.share, "deploy", "examples"), pvc)
		if err != nil {
			return err
		}
		if b, err := yaml.Marshal(pv); err == nil {
			_ = os.WriteFile(filepath.Join(l.out, "pv-"+v.Name+".yaml"), b, 0o644)
		}
		pv, err = l.cs.CoreV1().PersistentVolumes().Create(ctx, pv, metav1.CreateOptions{})
		if err != nil {
			return err
		}
		pv.Status.Phase = corev1.VolumeBound
		if _, err := l.cs.CoreV1().PersistentVolumes().UpdateStatus(ctx, pv, metav1.UpdateOptions{}); err != nil {
			return fmt.Errorf("bind PV %s: %w", pv.Name, err)
		}
		pvc.Status.Phase = corev1.ClaimBound
		pvc.Status.AccessModes = pvc.Spec.AccessModes
		pvc.Status.Capacity = corev1.ResourceList{corev1.ResourceStorage: resource.MustParse(volumeSize)}
		if _, err := l.cs.CoreV1().PersistentVolumeClaims(workloadNamespace).UpdateStatus(ctx, pvc, metav1.UpdateOptions{}); err != nil {
			return fmt.Errorf("bind PVC %s: %w", pvc.Name, err)
		}
		l.note("PV %s (%s, %s) bound to PVC default/%s (uid %s)", v.Name, v.Attributes["transport"], v.Mode, pvc.Name, pvc.UID)
	}
	return nil
}

func (l *Lab) pod(name string) (*corev1.Pod, error) {
	ctx, cancel := l.ctx()
	defer cancel()
	return l.cs.CoreV1().Pods(workloadNamespace).Get(ctx, name, metav1.GetOptions{})
}

// waitRunning waits until the pod's writer container runs; a pod that
// failed ends the wait at once.
func (l *Lab) waitRunning(name string, timeout time.Duration) (*corev1.Pod, error) {
	var p *corev1.Pod
	err := l.wait(timeout, "pod "+name+" Running", func() (bool, error) {
		var err error
		p, err = l.pod(name)
		if err != nil {
			return false, err
		}
		if p.Status.Phase == corev1.PodFailed || p.Status.Phase == corev1.PodSucceeded {
			return false, hardError{fmt.Errorf("pod %s is %s: %s", name, p.Status.Phase, containerState(p))}
		}
		for _, cs := range p.Status.ContainerStatuses {
			if cs.State.Running != nil {
				return true, nil
			}
		}
		return false, nil
	})
	if err != nil {
		l.podEvents(name)
	}
	return p, err
}

func containerState(p *corev1.Pod) string {
	var parts []string
	for _, cs := range p.Status.ContainerStatuses {
		switch {
		case cs.State.Terminated != nil:
			t := cs.State.Terminated
			parts = append(parts, fmt.Sprintf("%s terminated (exit %d, %s: %s)", cs.Name, t.ExitCode, t.Reason, t.Message))
		case cs.State.Waiting != nil:
			parts = append(parts, fmt.Sprintf("%s waiting (%s: %s)", cs.Name, cs.State.Waiting.Reason, cs.State.Waiting.Message))
		case cs.State.Running != nil:
			parts = append(parts, fmt.Sprintf("%s running since %s (restarts %d)", cs.Name, cs.State.Running.StartedAt.Format(time.RFC3339), cs.RestartCount))
		}
	}
	if len(parts) == 0 {
		return "no container status"
	}
	return strings.Join(parts, ", ")
}

// podEvents prints the events of a pod: where kubelet says what went wrong.
func (l *Lab) podEvents(name string) {
	ctx, cancel := l.ctx()
	defer cancel()
	evs, err := l.cs.CoreV1().Events(workloadNamespace).List(ctx, metav1.ListOptions{FieldSelector: "involvedObject.name=" + name})
	if err != nil {
		fmt.Printf("    events of %s: %v\n", name, err)
		return
	}
	for _, e := range evs.Items {
		fmt.Printf("    event %s: %s %s (x%d): %s\n", name, e.Type, e.Reason, e.Count, e.Message)
	}
}

// volumeHealth is the health kubelet wrote for the pod's volume "data":
// nil when the volume is healthy (no entry, or an entry with no
// conditions).
func (l *Lab) volumeHealth(name string) ([]corev1.VolumeHealthCondition, error) {
	p, err := l.pod(name)
	if err != nil {
		return nil, err
	}
	for _, vh := range p.Status.VolumeHealth {
		if vh.Name == volumeName {
			return vh.HealthConditions, nil
		}
	}
	return nil, nil
}

// storageHealth is what kubelet wrote for pathmend into CSINode's status.
func (l *Lab) storageHealth() ([]storagev1.StorageHealthCondition, error) {
	ctx, cancel := l.ctx()
	defer cancel()
	n, err := l.cs.StorageV1().CSINodes().Get(ctx, nodeName, metav1.GetOptions{})
	if err != nil {
		return nil, err
	}
	for _, sh := range n.Status.StorageHealth {
		if sh.Name == driverName {
			return sh.HealthConditions, nil
		}
	}
	return nil, nil
}

func describeVolumeHealth(cs []corev1.VolumeHealthCondition) string {
	if len(cs) == 0 {
		return "healthy (no condition)"
	}
	var parts []string
	for _, c := range cs {
		parts = append(parts, fmt.Sprintf("%s/%s: %s", c.Status, c.Reason, c.Message))
	}
	return strings.Join(parts, "; ")
}

func describeStorageHealth(cs []storagev1.StorageHealthCondition) string {
	if len(cs) == 0 {
		return "healthy (no condition)"
	}
	var parts []string
	for _, c := range cs {
		parts = append(parts, fmt.Sprintf("%s/%s: %s", c.Status, c.Reason, c.Message))
	}
	return strings.Join(parts, "; ")
}

// waitVolumeHealth waits until every pod's volume health satisfies want;
// it returns the health seen per pod.
func (l *Lab) waitVolumeHealth(pods []string, what string, timeout time.Duration, want func([]corev1.VolumeHealthCondition) bool) (map[string][]corev1.VolumeHealthCondition, error) {
	seen := map[string][]corev1.VolumeHealthCondition{}
	err := l.wait(timeout, what, func() (bool, error) {
		for _, p := range pods {
			h, err := l.volumeHealth(p)
			if err != nil {
				return false, err
			}
			seen[p] = h
			if !want(h) {
				return false, nil
			}
		}
		return true, nil
	})
	return seen, err
}

// waitStorageHealth waits until CSINode's storage health for pathmend
// satisfies want.
func (l *Lab) waitStorageHealth(what string, timeout time.Duration, want func([]storagev1.StorageHealthCondition) bool) ([]storagev1.StorageHealthCondition, error) {
	var seen []storagev1.StorageHealthCondition
	err := l.wait(timeout, what, func() (bool, error) {
		var err error
		seen, err = l.storageHealth()
		return err == nil && want(seen), err
	})
	return seen, err
}

func hasVolumeStatus(s corev1.VolumeHealthStatusType) func([]corev1.VolumeHealthCondition) bool {
	return func(cs []corev1.VolumeHealthCondition) bool {
		for _, c := range cs {
			if c.Status == s {
				return true
			}
		}
		return false
	}
}

func volumeHealthy(cs []corev1.VolumeHealthCondition) bool { return len(cs) == 0 }

// storageCondition matches a condition of status whose message names
// backend (pathmend names the NQN or IQN and the volumes).
func storageCondition(s storagev1.StorageHealthStatusType, backend string) func([]storagev1.StorageHealthCondition) bool {
	return func(cs []storagev1.StorageHealthCondition) bool {
		for _, c := range cs {
			if c.Status == s && strings.Contains(c.Message, backend) {
				return true
			}
		}
		return false
	}
}

// storageClear: no condition names backend.
func storageClear(backend string) func([]storagev1.StorageHealthCondition) bool {
	return func(cs []storagev1.StorageHealthCondition) bool {
		for _, c := range cs {
			if strings.Contains(c.Message, backend) {
				return false
			}
		}
		return true
	}
}
