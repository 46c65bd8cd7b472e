package main

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"

	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"sigs.k8s.io/yaml"
)

// Volume is one of the lab's persistent volumes: a PV adapted from
// pathmend's examples (deploy/examples) to the lab's targets, and its claim.
type Volume struct {
	// PV and PVC name; the PVC is in namespace "default".
	Name   string
	Handle string
	Mode   corev1.PersistentVolumeMode
	// Attributes replace the example's volume attributes.
	Attributes map[string]string
	FSType     string
	// Example is the file in deploy/examples the PV is adapted from.
	Example string
	// Secret, when set, is the node-stage secret (namespace pathmend).
	Secret *corev1.Secret
}

const (
	workloadNamespace = "default"
	secretNamespace   = "pathmend"
	volumeSize        = "64Mi"
)

// loadExample reads the PersistentVolume (and Secret, if any) of an
// example manifest.
func loadExample(path string) (*corev1.PersistentVolume, *corev1.Secret, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, nil, err
	}
	var pv *corev1.PersistentVolume
	var sec *corev1.Secret
	docs, err := splitYAML(b)
	if err != nil {
		return nil, nil, fmt.Errorf("%s: %w", path, err)
	}
	for _, doc := range docs {
		var meta metav1.TypeMeta
		if err := yaml.Unmarshal(doc, &meta); err != nil {
			return nil, nil, fmt.Errorf("%s: %w", path, err)
		}
		switch meta.Kind {
		case "PersistentVolume":
			pv = &corev1.PersistentVolume{}
			if err := yaml.UnmarshalStrict(doc, pv); err != nil {
				return nil, nil, fmt.Errorf("%s: %w", path, err)
			}
		case "Secret":
			sec = &corev1.Secret{}
			if err := yaml.UnmarshalStrict(doc, sec); err != nil {
				return nil, nil, fmt.Errorf("%s: %w", path, err)
			}
		}
	}
	if pv == nil || pv.Spec.CSI == nil {
		return nil, nil, fmt.Errorf("%s: no CSI PersistentVolume", path)
	}
	return pv, sec, nil
}

// PV adapts the example PV to v. The example's shape stays (driver,
// reclaim policy, access modes, the secret reference when v has a
// secret); names, attributes, mode, size, and the claim it is bound to
// are the lab's.
func (v Volume) PV(examplesDir string, claim *corev1.PersistentVolumeClaim) (*corev1.PersistentVolume, error) {
	pv, _, err := loadExample(filepath.Join(examplesDir, v.Example))
	if err != nil {
		return nil, err
	}
	pv.ObjectMeta = metav1.ObjectMeta{Name: v.Name, Labels: map[string]string{"app.kubernetes.io/part-of": "pathmend-kubelet-lab"}}
	pv.Spec.Capacity = corev1.ResourceList{corev1.ResourceStorage: resource.MustParse(volumeSize)}
	mode := v.Mode
	pv.Spec.VolumeMode = &mode
	pv.Spec.StorageClassName = ""
	pv.Spec.CSI.VolumeHandle = v.Handle
	pv.Spec.CSI.VolumeAttributes = v.Attributes
	pv.Spec.CSI.FSType = v.FSType
	pv.Spec.CSI.NodeStageSecretRef = nil
	if v.Secret != nil {
		pv.Spec.CSI.NodeStageSecretRef = &corev1.SecretReference{Name: v.Secret.Name, Namespace: v.Secret.Namespace}
	}
	// Pre-bound: the claim's UID in claimRef is what kubelet checks.
	pv.Spec.ClaimRef = &corev1.ObjectReference{Kind: "PersistentVolumeClaim", APIVersion: "v1", Namespace: claim.Namespace, Name: claim.Name, UID: claim.UID}
	return pv, nil
}

// PVC is v's claim, naming its PV.
func (v Volume) PVC() *corev1.PersistentVolumeClaim {
	mode := v.Mode
	empty := ""
	return &corev1.PersistentVolumeClaim{
		ObjectMeta: metav1.ObjectMeta{Name: v.Name, Namespace: workloadNamespace},
		Spec: corev1.PersistentVolumeClaimSpec{
			AccessModes:      []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
			VolumeMode:       &mode,
			StorageClassName: &empty,
			VolumeName:       v.Name,
			Resources:        corev1.VolumeResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceStorage: resource.MustParse(volumeSize)}},
		},
	}
}

// csiDriver reads the CSIDriver object pathmend's kustomize base installs.
func csiDriver(path string) (*storagev1.CSIDriver, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	d := &storagev1.CSIDriver{}
	if err := yaml.UnmarshalStrict(b, d); err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	if d.Name != driverName {
		return nil, fmt.Errorf("%s: CSIDriver %q, want %q", path, d.Name, driverName)
	}
	return d, nil
}

// splitYAML splits a multi-document YAML stream into its documents.
func splitYAML(b []byte) ([][]byte, error) {
	r := utilyaml.NewYAMLReader(bufio.NewReader(bytes.NewReader(b)))
	var docs [][]byte
	for {
		doc, err := r.Read()
		if errors.Is(err, io.EOF) {
			return docs, nil
		}
		if err != nil {
			return nil, err
		}
		docs = append(docs, doc)
	}
}
